"""scripts/scanner_scale.py runs end to end on a tiny workload, so it never rots.
No timing is asserted: benchmarks are not tests."""

import json
import os
import subprocess
import sys

import pytest

from relay.store.connection import connect

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "scanner_scale.py")


def test_scanner_scale_requeues_every_message_once(redis_url):
    client = connect(redis_url)
    client.flushdb()
    run = subprocess.run([sys.executable, SCRIPT, "--redis-url", redis_url, "--topics", "2",
                          "--channels", "10", "--messages", "2000", "--batch", "10",
                          "--window", "1", "--lead", "2", "--idle-seconds", "1"],
                         capture_output=True, text=True, timeout=120)
    client.flushdb()
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["channels"] == 20
    assert result["matched"] == result["requeued"] == result["queued"] == 2000
    assert result["in_flight_left"] == result["due_entries_left"] == 0
    assert result["all_requeued"] is True
    assert result["idle_in_flight"] == 2000
    assert 0 <= result["lateness_p50_ms"] <= result["lateness_p99_ms"] \
        <= result["lateness_max_ms"]
