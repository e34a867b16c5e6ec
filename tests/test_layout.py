"""The data layout in force and the processes of each release (relay/store/layout.py),
as `relay-admin upgrade status|finish` show and steer them, on fakeredis, a real Redis
and a cluster."""

import json
import socket
import time

import pytest

from relay.store import keys, layout, runner
from relay.store.layout import LayoutRefused, Presence
from tests.helpers.admin import run

HOST = socket.gethostname()
WIDTH = max(len(HOST), len("host"))
NEWER = ("relay 0.6.2 reads data layout 2, 3, 4, 5; this Redis holds data layout 6: run a "
         "release that reads layout 6 (`relay-admin upgrade status` lists the live ones)")


def earlier(client, kind: str, process_id: str) -> None:
    """A live broker or scanner of 0.1.0, as it registers: in its liveness set alone."""
    expiry = int(time.time() * 1000) + 10_000
    client.zadd(keys.BROKERS if kind == "broker" else keys.SCANNERS, {process_id: expiry})
    if kind == "broker":
        client.hset(keys.broker_key(process_id), mapping={"version": "1.3.0"})


def test_a_fresh_redis_gets_the_layout_this_release_writes(backend):
    assert layout.establish(backend) == 5
    assert backend.get(keys.LAYOUT) == b"5"
    assert layout.establish(backend) == 5


def test_a_redis_of_the_previous_release_gets_layout_2(backend):
    """0.1.0 wrote layout 2 and no key: its live processes read 2."""
    earlier(backend, "broker", "old-1")
    backend.sadd(keys.TOPICS, "t")
    assert layout.establish(backend) == 2
    assert backend.get(keys.LAYOUT) == b"2"


@pytest.mark.parametrize("value, message", [
    (b"6", NEWER),
    (b"1", "relay 0.6.2 reads data layout 2, 3, 4, 5; this Redis holds data layout 1 (before issue 35 "
           "(2026-11-25), with a leases hash beside each in-flight set): serve it with relay "
           "0.1.0 until none of layout 1 is left (that release reads both), then start "
           "0.6.2")])
def test_a_layout_this_release_cannot_read_is_refused_in_one_line(backend, value, message):
    backend.set(keys.LAYOUT, value)
    with pytest.raises(LayoutRefused) as refused:
        layout.establish(backend)
    assert str(refused.value) == message
    assert backend.get(keys.LAYOUT) == value


def test_a_redis_still_holding_layout_1_is_refused_and_keeps_no_layout(backend):
    """Messages left in flight by a release before issue 35, in a Redis that 0.1.0 ran
    (no relay:layout): refused with what was found, not misread."""
    backend.sadd(keys.TOPICS, "t")
    backend.hset("relay:{t}:ch:c:leases", "0000000000000001", "1700000000000 b1:1")
    with pytest.raises(LayoutRefused) as refused:
        layout.establish(backend)
    assert str(refused.value) == (
        "relay 0.6.2 reads data layout 2, 3, 4, 5; this Redis holds data layout 1 (before issue 35 "
        "(2026-11-25), with a leases hash beside each in-flight set): relay:{t}:ch:c:leases "
        "(1 message in flight of layout 1): serve it with relay 0.1.0 until none of layout "
        "1 is left (that release reads both), then start 0.6.2")
    assert backend.get(keys.LAYOUT) is None


def test_relay_admin_refuses_a_layout_it_cannot_read_but_shows_the_upgrade(backend):
    backend.set(keys.LAYOUT, 6)
    result = run(backend, "topics")
    assert (result.exit_code, result.output) == (1, f"relay-admin: {NEWER}\n")
    assert run(backend, "upgrade", "status").exit_code == 0


def test_a_heartbeat_registers_the_process_and_reads_the_layout_again(backend):
    layout.establish(backend)
    presence = Presence(backend, "scanner", "new-1", 2)
    assert presence.heartbeat() is None
    [process] = layout.Deployment.read(backend).processes
    assert process == layout.Process("scanner", "new-1", "0.6.2", (2, 3, 4, 5), 2, HOST,
                                     " ".join(layout.own_libraries(backend)))
    backend.set(keys.LAYOUT, 6)
    assert str(presence.heartbeat()) == NEWER
    pipe = backend.pipeline(transaction=False)
    presence.leave(pipe)
    pipe.execute()
    assert layout.Deployment.read(backend).processes == []


def test_upgrade_status_lists_each_release_and_what_blocks_the_next_layout(backend):
    earlier(backend, "broker", "old-b")
    earlier(backend, "scanner", "old-s")
    assert layout.establish(backend) == 2       # 0.1.0 reads layout 2 alone
    Presence(backend, "broker", "new-b", 2).heartbeat()
    result = run(backend, "upgrade", "status")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "data layout in force: 2 (of relay 0.1.0 and 0.2.0)",
        "relay 0.6.2 reads 2,3,4,5 and writes 2,3,4,5",
        "",
        f"kind     process  {'host':{WIDTH}}  release           reads    writes",
        f"broker   new-b    {HOST:{WIDTH}}  0.6.2             2,3,4,5  2",
        f"broker   old-b    {'-':{WIDTH}}  0.1.0 or earlier  2        -",
        f"scanner  old-s    {'-':{WIDTH}}  0.1.0 or earlier  2        -",
        "",
        "next layout: 5, blocked by 1 broker of 0.1.0 or earlier and 1 scanner of 0.1.0 or "
        "earlier (they do not read layout 5)"]
    data = json.loads(run(backend, "upgrade", "status", "--json").output)
    assert (data["layout"], data["reads"], data["writes"], data["next"]) == (
        2, [2, 3, 4, 5], [2, 3, 4, 5], {"layout": 5, "blocked_by": ["old-b", "old-s"]})
    assert [(p["kind"], p["id"], p["release"], p["reads"], p["writes"])
            for p in data["processes"]] == [
        ("broker", "new-b", "0.6.2", [2, 3, 4, 5], 2),
        ("broker", "old-b", "0.1.0 or earlier", [2], None),
        ("scanner", "old-s", "0.1.0 or earlier", [2], None)]


def test_a_newer_layout_waits_for_every_process_that_does_not_read_it(backend):
    """finish refuses while a process of 0.1.0 lives, says which, and puts 5 in force
    once none does; then it has nothing newer to put in force."""
    earlier(backend, "broker", "old-b")
    earlier(backend, "broker", "old-c")
    layout.establish(backend)
    Presence(backend, "scanner", "new-s", 2).heartbeat()
    status = run(backend, "upgrade", "status").output.splitlines()
    assert status[-1] == ("next layout: 5, blocked by 2 brokers of 0.1.0 or earlier (they do "
                          "not read layout 5)")
    refused = run(backend, "upgrade", "finish")
    assert (refused.exit_code, refused.output) == (
        1, "relay-admin: layout 5 not put in force: 2 brokers of 0.1.0 or earlier still "
           "live; replace them, then run this again\n")
    assert backend.get(keys.LAYOUT) == b"2"
    backend.zrem(keys.BROKERS, "old-b", "old-c")
    assert run(backend, "upgrade", "status").output.splitlines()[-1] == (
        "next layout: 5, ready: `relay-admin upgrade finish`")
    finished = run(backend, "upgrade", "finish")
    assert (finished.exit_code, finished.output) == (
        0, "data layout 5 is in force; relay 0.6.2 writes no newer one\n")
    assert backend.get(keys.LAYOUT) == b"5"
    assert run(backend, "upgrade", "status").output.splitlines()[-1] == (
        "next layout: none (relay 0.6.2 writes none newer)")


def test_finish_deletes_the_function_libraries_no_live_process_uses(backend):
    """Each release loads its own library (about 0.5 MB of Redis). `upgrade finish` deletes
    those no live process says it uses, on every master; while a process of a release
    that does not say is live, it deletes none."""
    layout.establish(backend)
    for name in ("relay_0123456789ab", "relay_aaaaaaaaaaaa"):
        for server in runner.masters(backend):
            server.function_load(f"#!lua name={name}\nredis.register_function("
                                 f"'x_{name[6:]}', function() return 1 end)")
    live = Presence(backend, "broker", "live-b", 5)
    live.library = "relay_aaaaaaaaaaaa"     # a live broker of another release of 0.6.2 on
    live.heartbeat()
    Presence(backend, "scanner", "silent-s", 5).heartbeat()
    backend.hset(keys.process_key("silent-s"), "release", "0.6.1")    # as 0.6.1 registers
    backend.hdel(keys.process_key("silent-s"), "library")
    kept = run(backend, "upgrade", "finish")
    assert (kept.exit_code, kept.output) == (0, (
        "data layout 5 is in force; relay 0.6.2 writes no newer one\n"
        "function libraries kept: 1 scanner of 0.6.1 live, of a release that does not say "
        "which it uses\n"))
    backend.delete(keys.process_key("silent-s"))
    finished = run(backend, "upgrade", "finish", "--json")
    assert (finished.exit_code, json.loads(finished.output)) == (
        0, {"layout": 5, "libraries_deleted": ["relay_0123456789ab"]})
    for server in runner.masters(backend):
        assert runner.libraries(server) == sorted(layout.own_libraries(backend)
                                                  + ["relay_aaaaaaaaaaaa"])
