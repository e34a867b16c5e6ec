"""The real pynsq (tornado) client, run in its own process by pynsq_client.py and
pynsq_secure.py (as modules, from the repository root, so they import tests.helpers)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_pynsq_client(*args, timeout=40) -> list:
    """The JSON lines pynsq_client.py prints for its arguments (see its docstring)."""
    out = subprocess.run([sys.executable, "-m", "tests.helpers.pynsq_client", *map(str, args)],
                         cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def run_pynsq_secure(port, topic, conn: dict, sizes) -> dict:
    """What pynsq_secure.py published and received: bodies of `sizes` with connection
    settings `conn`."""
    out = subprocess.run([sys.executable, "-m", "tests.helpers.pynsq_secure", str(port), topic,
                          json.dumps(conn), *map(str, sizes)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])
