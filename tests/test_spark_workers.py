"""register() refuses a session whose Python workers cannot import relay, with one line
saying what to set, before the first read would fail 10 s later with a Java stack trace.
No Spark session is needed: the check reads the session's conf and runs the interpreter."""

import subprocess
import sys

import pytest

pytest.importorskip("pyspark")

import relay.spark  # noqa: E402


class Session:
    """What check_worker_python reads of a SparkSession: its conf."""

    def __init__(self, **conf):
        self.conf = self
        self._conf = conf

    def get(self, key, default=None):
        return self._conf.get(key, default)


def test_workers_that_import_relay_pass(monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    relay.spark.check_worker_python(Session(**{"spark.pyspark.python": sys.executable}))


def test_workers_that_cannot_import_relay_get_one_line(tmp_path, monkeypatch):
    python = tmp_path / "python3"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    monkeypatch.setenv("PYSPARK_PYTHON", str(python))
    with pytest.raises(relay.spark.WorkerPythonUnfit) as error:
        relay.spark.check_worker_python(Session())
    assert str(error.value) == (f"Spark's Python workers would run {python}: {python} cannot "
                                f"import relay.spark; set PYSPARK_PYTHON={sys.executable}")


def test_workers_on_a_missing_interpreter_get_one_line(monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    with pytest.raises(relay.spark.WorkerPythonUnfit) as error:
        relay.spark.check_worker_python(Session(**{"spark.pyspark.python": "python-nowhere"}))
    assert str(error.value) == ("Spark's Python workers would run python-nowhere: python-nowhere "
                                f"is not found; set PYSPARK_PYTHON={sys.executable}")


STOP_ON_SIGTERM = """
import os, signal, time
import relay.spark.source
signal.signal(signal.SIGTERM, relay.spark.source._exit)
try:
    os.kill(os.getpid(), signal.SIGTERM)        # stopWorker
    time.sleep(10)
finally:
    os.kill(os.getpid(), signal.SIGTERM)        # the factory's stop, as stop() begins
    sum(range(1000))
    print("parked", flush=True)
"""


def test_the_second_sigterm_spark_sends_does_not_cut_stop_short():
    """Spark ends the source's runner with two SIGTERMs: the second, arriving while the
    runner's `finally` calls stop(), must not abort the park."""
    done = subprocess.run([sys.executable, "-c", STOP_ON_SIGTERM], capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "parked\n"), done.stderr
