"""relay-admin through click's CliRunner, against a test backend; and as a subprocess."""

import json
import os
import subprocess
import sys

from click.testing import CliRunner

from relay import admin
from relay.admin import args as admin_args

RELAY_ADMIN = os.path.join(os.path.dirname(sys.executable), "relay-admin")


def run(backend, *args, input=None, color=False):
    """relay-admin against the test backend (fakeredis or the real server); `color`
    as on a terminal (click drops escape codes otherwise)."""
    original = admin_args.connect
    admin_args.connect = lambda *a, **k: backend
    try:
        return CliRunner().invoke(admin.main, list(args), input=input, color=color)
    finally:
        admin_args.connect = original


def ok(backend, *args, input=None) -> list[str]:
    result = run(backend, *args, input=input)
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def ok_json(backend, *args):
    return json.loads("\n".join(ok(backend, *args, "--json")))


def relay_admin(redis_url, *args, **kwargs):
    """relay-admin run as a subprocess with REDIS_URL set: the CompletedProcess."""
    return subprocess.run([RELAY_ADMIN, *args], env={**os.environ, "REDIS_URL": redis_url},
                          capture_output=True, text=True, timeout=60, **kwargs)
