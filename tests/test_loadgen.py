"""The load generator runs end to end on a tiny workload, so it never rots.
No timing is asserted: benchmarks are not tests."""

import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "loadgen.py")


@pytest.mark.parametrize("mode, args, count_key", [
    ("pub", ["--producers", "2"], "messages"),
    ("mpub", ["--batch", "10"], "messages"),
    ("sub", ["--consumers", "2", "--messages", "200"], "messages"),
    ("e2e", ["--consumers", "2", "--batch", "10", "--rate", "500"], "received"),
])
def test_loadgen_modes(broker, mode, args, count_key):
    out = subprocess.run([sys.executable, SCRIPT, mode, "--port", str(broker),
                          "--seconds", "1", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["mode"] == mode
    assert result[count_key] > 0
    if mode == "sub":
        assert result["messages"] == 200
    assert result["window_end"] > result["window_start"]
    if mode == "e2e":
        assert result["received"] == result["sent"]
        assert result["p50_ms"] is not None


def test_bench_script_writes_benchmarks_md(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    script = os.path.join(os.path.dirname(SCRIPT), "bench.py")
    run = subprocess.run([sys.executable, script, "--runs", "1", "--seconds", "1",
                          "--only", "e2e fixed", "--memory-messages", "10000",
                          "--idle-samples", "10", "--out", str(out),
                          "--scanner-args=--topics 2 --channels 5 --messages 1000 --window 1 "
                          "--lead 2 --idle-seconds 1"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    text = out.read_text()
    assert re.search(r"^\| publish \| [\d,]+ \| [\d,]+ \|$", text, re.M)
    assert re.search(r"^\| e2e fixed 10,000 msgs/s, 200 B \| [\d,]+ \| .* \| ([\d,]+) sent = "
                     r"received \| loop \|", text, re.M)
    assert "10,000 messages of 200 B published through the broker" in text
    assert "(10,000 queued after)" in text
    assert "over 10 samples" in text
    assert "`.venv/bin/python scripts/scanner_scale.py --topics 2" in text
    assert "| requeued (timeout_count) | 1,000 of 1,000, 0 left in flight |" in text


def test_clients_bench_drains_with_every_client():
    """pynsq, gnsq and the raw client each receive every message once; the figures are
    there (not their values)."""
    script = os.path.join(os.path.dirname(SCRIPT), "clients_bench.py")
    run = subprocess.run([sys.executable, script, "--messages", "10000", "--runs", "1"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["client"] for r in results] == ["pynsq", "gnsq", "raw"]
    for r in results:
        assert r["messages"] == 10000
        for key in ("seconds", "msgs_per_s", "broker_us_per_msg", "redis_us_per_msg",
                    "client_us_per_msg"):
            assert r[key] > 0, (r["client"], key)
    assert re.search(r"^\| gnsq \| [\d,]+ \| .* \| 10,000 \|", run.stdout, re.M)
