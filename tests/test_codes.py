"""The codes the scripts answer with, declared once (relay/store/codes.py): the loader
writes their values in every script, Lua reads the values Python declares, and no script
names one that is not declared (a misspelt CODE.X would be a Lua error or nil)."""

import re
from importlib import resources

import pytest

from relay.store import codes, runner

NAMES = list(codes.CODES)


def test_the_library_has_the_values_in_place_of_the_names():
    for sharded in (False, True):
        assert "CODE." not in runner.load_library(sharded).code


def test_lua_reads_the_codes_python_declares(store):
    read = b", ".join(b"CODE." + name.encode() for name in NAMES)
    assert store.redis.eval(codes.inline(b"return {" + read + b"}"), 0) == \
        [getattr(codes, name) for name in NAMES]
    assert store.redis.eval(codes.inline(b"return 1-CODE.NOT_OWNER"), 0) == 2


def test_a_name_not_declared_stops_the_loading():
    with pytest.raises(KeyError):
        codes.inline(b"return CODE.NOT_A_CODE")


def test_scripts_name_only_declared_codes():
    folder = resources.files("relay.store") / "scripts"
    named = set()
    for path in [*folder.iterdir(), *(folder / "lib").iterdir()]:
        if path.name.endswith(".lua"):
            named.update(re.findall(r"CODE\.(\w+)", path.read_text()))
    assert named and named <= set(NAMES)
