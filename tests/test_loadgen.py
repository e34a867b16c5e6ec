"""The load generator runs end to end on a tiny workload, so it never rots.
No timing is asserted: benchmarks are not tests."""

import json
import os
import subprocess
import sys

import pytest

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
    if mode == "e2e":
        assert result["received"] == result["sent"]
        assert result["p50_ms"] is not None
