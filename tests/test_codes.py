"""The codes the scripts answer with, declared once (relay/store/codes.py): every script
starts with them, Lua reads the values Python declares, and no script names one that is
not declared (a misspelt CODE.X is nil in Lua, a reply no caller expects)."""

import re
from importlib import resources

from relay.store import codes, runner

NAMES = [name for name in vars(codes) if name.isupper()]


def test_every_script_starts_with_the_codes():
    for sharded in (False, True):
        for script in runner.load_scripts(sharded).values():
            assert script.source.startswith(codes.lua()), script.name


def test_lua_reads_the_codes_python_declares(store):
    read = b", ".join(b"CODE." + name.encode() for name in NAMES)
    assert store.redis.eval(codes.lua() + b"return {" + read + b"}", 0) == \
        [getattr(codes, name) for name in NAMES]


def test_scripts_name_only_declared_codes():
    folder = resources.files("relay.store") / "scripts"
    named = set()
    for path in [*folder.iterdir(), *(folder / "lib").iterdir()]:
        if path.name.endswith(".lua"):
            named.update(re.findall(r"CODE\.(\w+)", path.read_text()))
    assert named and named <= set(NAMES)
