"""Spark without a Java runtime, the way a user meets it: the Spark tests skip with one
line (or fail under RELAY_REQUIRE_SPARK=1, as on CI), and the example pipeline stops
with one line, not a Java gateway stack trace."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("pyspark")

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MISSING = ("no Java runtime for Spark 4 (JAVA_HOME=/nonexistent has no bin/java): install "
           "Java 17 or 21 (e.g. apt-get install openjdk-17-jre-headless) and put its java "
           "on PATH or set JAVA_HOME to it")


def path_without_java(tmp_path) -> str:
    """PATH with each folder that holds a java replaced by a copy of its links, less java."""
    folders = []
    for i, folder in enumerate(os.environ["PATH"].split(os.pathsep)):
        if os.path.exists(os.path.join(folder, "java")):
            mirror = tmp_path / f"path{i}"
            mirror.mkdir()
            for name in os.listdir(folder):
                if name != "java":
                    (mirror / name).symlink_to(os.path.join(folder, name))
            folder = str(mirror)
        folders.append(folder)
    return os.pathsep.join(folders)


def no_java_env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RELAY_REQUIRE_SPARK", "PYSPARK_GATEWAY_PORT")}
    return {**env, "JAVA_HOME": "/nonexistent", "PATH": path_without_java(tmp_path), **extra}


def test_the_spark_tests_skip_with_one_line_saying_what_is_missing(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pytest", "tests/test_spark.py",
                          "tests/test_spark_batches.py", "-ra", "-q", "-p", "no:cacheprovider"],
                         cwd=HERE, env=no_java_env(tmp_path), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:]
    summary = out.stdout.splitlines()
    [skip] = [line for line in summary if line.startswith("SKIPPED")]
    assert skip.startswith("SKIPPED [1] tests/test_spark.py:")
    assert skip.endswith(f": {MISSING}")
    assert summary[-1].startswith("6 passed, 1 skipped in ")


def test_the_spark_tests_fail_without_java_when_spark_is_required(tmp_path):
    env = no_java_env(tmp_path, RELAY_REQUIRE_SPARK="1")
    out = subprocess.run([sys.executable, "-m", "pytest", "tests/test_spark.py", "-ra", "-q",
                          "-p", "no:cacheprovider", "-k", "snapshot_read"],
                         cwd=HERE, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stdout[-3000:]
    assert f"Failed: {MISSING}" in out.stdout
    assert "1 error" in out.stdout.splitlines()[-1]


def test_the_example_pipeline_stops_with_one_line_saying_what_is_missing(tmp_path):
    out = subprocess.run([sys.executable, "scripts/spark_pipeline.py", "--master", "local[2]",
                          "--available-now", "--checkpoint", str(tmp_path / "ck")],
                         cwd=HERE, env=no_java_env(tmp_path), capture_output=True, text=True,
                         timeout=120)
    assert (out.returncode, out.stdout, out.stderr) == (1, "", f"spark_pipeline: {MISSING}\n")


def test_a_java_older_than_17_is_named(tmp_path):
    home = tmp_path / "jdk11"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    java.chmod(0o755)
    out = subprocess.run([sys.executable, "-c", "import relay.spark; relay.spark.check_java()"],
                         cwd=HERE, env={**no_java_env(tmp_path), "JAVA_HOME": str(home)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == (
        f'relay.spark.JavaMissing: no Java runtime for Spark 4 ({java}: openjdk version '
        f'"11.0.2" 2019-01-15): install Java 17 or 21 (e.g. apt-get install '
        f'openjdk-17-jre-headless) and put its java on PATH or set JAVA_HOME to it')
