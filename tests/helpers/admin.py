"""relay-admin through click's CliRunner, against a test backend."""

import json

from click.testing import CliRunner

from relay import admin
from relay.admin import args as admin_args


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
