"""Redis at maxmemory under noeviction (issue 36): publishing is refused with its cause,
before anything is written (an MPUB all or nothing), while everything that frees memory
or only moves data goes on (runner.REFUSED_AT_MAXMEMORY), and publishing takes again once
consumers have drained. On the embedded Valkey 8, a server of this module's own, as
maxmemory is set on it (fakeredis has none)."""

import json
import shutil
import tempfile
import time

import pytest
import redis

from relay import embedded
from relay.errors import StoreError
from relay.liveness import Liveness
from relay.store import Store, keys, nodes
from relay.store.causes import OUT_OF_MEMORY
from relay.store.runner import Op
from relay.store.keys import TopicKeys
from relay.codec import FRAME_ERROR, FRAME_RESPONSE, parse_record
from tests.helpers.admin import relay_admin
from tests.helpers.api import Api
from tests.helpers.processes import Processes
from tests.helpers.wire import Wire

BODY = 1000
HEADROOM = 4_000_000    # bytes of maxmemory above what the server holds when a test starts,
                        # well above what it takes once to run what it has not run yet


@pytest.fixture(scope="module")
def server():
    """A server of this module's own: its client."""
    port = embedded.free_port()
    data = tempfile.mkdtemp(prefix="relay-test-maxmemory-")
    proc = embedded.start(port, data, extra=("--save", "", "--appendonly", "no"))
    client = redis.Redis(port=port)
    yield client
    client.close()
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(data, ignore_errors=True)


def limit_memory(client: redis.Redis, headroom: int = HEADROOM) -> None:
    """Empty the server, then maxmemory at what it holds plus `headroom`."""
    client.config_set("maxmemory", 0)
    client.flushall()
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", client.info("memory")["used_memory"] + headroom)


def body(n: int) -> bytes:
    return b"%06d" % n + b"x" * (BODY - 6)


def publish_until_refused(store: Store, topic: str) -> list[bytes]:
    """MPUBs of 20 messages until Redis refuses one, then single ones until it refuses
    one of them too (a refused command frees what it had buffered, so smaller ones may
    still take): the bodies acknowledged. Each refusal must say why."""
    acknowledged: list[bytes] = []
    for batch in (20, 1):
        while True:
            bodies = [body(len(acknowledged) + i) for i in range(batch)]
            try:
                store.publish(topic, bodies)
            except StoreError as e:
                assert str(e) == OUT_OF_MEMORY
                break
            acknowledged += bodies
    return acknowledged


def test_at_maxmemory_publishing_is_refused_and_everything_else_goes_on(server):
    limit_memory(server)
    store = Store(server)
    assert store.subscribe("t", "c", "b1") is True
    acknowledged = publish_until_refused(store, "t")
    assert len(acknowledged) > 100
    assert store.reads.refusal() == OUT_OF_MEMORY
    before = store.reads.read_channel("t", "c")
    for bodies, defer in (([body(0)], 0), ([body(0)], 60_000), ([b"big"] * 6000, 0)):
        with pytest.raises(StoreError) as refused:    # 6000: an MPUB staged first
            store.publish("t", bodies, defer)
        assert str(refused.value) == OUT_OF_MEMORY
    assert store.reads.read_channel("t", "c") == before     # nothing of them was written
    assert int(server.get(TopicKeys.of("t").ids)) == len(acknowledged)

    # a new channel, a consumer more and less, the processes' heartbeats, the news
    joined = store.run(store.subscribe_op("t", "new", "b1"))
    assert joined.created
    assert store.run(store.unsubscribe_op("t", "new", "b1", False, False,
                                          joined.incarnation)) == 0
    assert server.hget(f"relay:{{t}}:ch:new:consumers", "b1") is None
    assert Liveness(server, keys.SCANNERS, 5_000).rank("s1") == (0, 1)
    assert store.run(Op("versions", [nodes.SINGLE + nodes.NEWS],     # HSETNX of its field
                        [TopicKeys.of("fresh").version])) == [b"0", None, None, None, None]
    assert store.reads.seed_due(["t"]) == 0

    # deliveries, TOUCH, REQ (now and deferred), a timeout, FIN
    (first,) = store.deliver("t", "c", [("o", 60_000, 3)])
    ids = [parse_record(r)[2] for r in first]
    assert store.touch("t", "c", [("o", ids[0], 60_000)])[0] > 0
    assert store.requeue("t", "c", [("o", ids[1], 0), ("o", ids[2], 10)]) == [1, 1]
    (expiring,) = store.deliver("t", "c", [("o", 1, 1)])
    time.sleep(0.02)
    assert store.scan("t", "c")[:2] == (1, 1)          # timed out, and the deferred one
    assert store.finish("t", "c", [("o", ids[0])]) == [1]
    delivered = [parse_record(r)[3] for r in first[:1]]

    # emptying and deleting a channel, by a Store made now (as each relay-admin command's
    # is): it finds the library there, and loads nothing
    admin = Store(server)
    admin.control.empty_channel("t", "new")
    assert admin.control.delete_channel("t", "new") is True

    # the rest drains, and publishing takes again by itself
    while True:
        (records,) = store.deliver("t", "c", [("o", 60_000, 100)])
        if not records:
            break
        delivered += [parse_record(r)[3] for r in records]
        assert store.finish("t", "c", [("o", parse_record(r)[2]) for r in records]) \
            == [1] * len(records)
    assert sorted(delivered) == sorted(acknowledged) and len(expiring) == 1
    assert store.publish("t", [b"again"]) == len(acknowledged) + 1
    assert store.reads.refusal() is None


# -- a broker and a scanner on a full Redis -------------------------------------------------

REFUSED = {command: (FRAME_ERROR, f"E_{command}_FAILED {command} failed: {OUT_OF_MEMORY}"
                     .encode()) for command in ("PUB", "MPUB", "DPUB")}


@pytest.fixture
def full_stack(tmp_path):
    """The embedded server of this test only, with a broker and a scanner on it:
    (client, url, tcp port, Api)."""
    port = embedded.free_port()
    proc = embedded.start(port, str(tmp_path / "redis"),
                          extra=("--save", "", "--appendonly", "no"))
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis(port=port)
    limit_memory(client)
    procs = Processes(url, str(tmp_path))
    _, tcp_port = procs.broker()
    procs.scanner()
    yield client, url, tcp_port, Api(tcp_port, procs.http_ports[tcp_port])
    procs.stop_all()
    proc.terminate()
    proc.wait(10)


def fill_over_tcp(port: int) -> list[bytes]:
    """MPUBs of 20 messages, then PUBs, each until refused: the bodies acknowledged. The
    refusals are nsqd's fatal errors, with the cause."""
    acknowledged: list[bytes] = []
    for command, batch in (("MPUB", 20), ("PUB", 1)):
        wire = Wire(port)
        while True:
            bodies = [body(len(acknowledged) + i) for i in range(batch)]
            reply = wire.mpub("t", bodies) if batch > 1 else wire.pub("t", bodies[0])
            if reply != (FRAME_RESPONSE, b"OK"):
                assert reply == REFUSED[command]
                assert wire.closed()
                break
            acknowledged += bodies
    return acknowledged


def refusal_once_full(publish, acknowledged: list) -> tuple:
    """`publish(body)`'s refusal, with a fresh body each try: a full Redis can free
    memory between two calls (its cron shrinks clients' buffers: a query buffer that
    held a big MPUB of the fill frees up to that much), and then some are taken; a body
    taken counts as acknowledged. publish returns (taken, reply). Taking more than the
    headroom the server was given means it is not full."""
    for _ in range(HEADROOM // BODY):
        fresh = body(len(acknowledged))
        taken, reply = publish(fresh)
        if not taken:
            return reply
        acknowledged.append(fresh)
    raise AssertionError("publishes of the headroom's bytes taken: the server is not full")


def test_a_full_redis_refuses_publishes_with_the_cause_drains_and_takes_again(full_stack):
    client, url, port, api = full_stack
    assert api.request("POST", "/topic/create?topic=t")[0] == 200
    for channel in ("c", "d"):
        assert api.request("POST", f"/channel/create?topic=t&channel={channel}")[0] == 200
    acknowledged = fill_over_tcp(port)
    assert len(acknowledged) > 1000

    def dpub(fresh):
        reply = Wire(port).command("DPUB t 1000", fresh).frame()
        return reply == (FRAME_RESPONSE, b"OK"), reply

    def http(path):
        def publish(fresh):
            status, data, headers = api.request("POST", path, fresh)
            if status == 200:
                return True, None
            return False, (status, headers.get("Content-Type"), json.loads(data))
        return publish
    assert refusal_once_full(dpub, acknowledged) == REFUSED["DPUB"]
    refused = (503, "application/json; charset=utf-8", {"message": OUT_OF_MEMORY})
    assert refusal_once_full(http("/pub?topic=t"), acknowledged) == refused
    assert refusal_once_full(http("/mpub?topic=t"), acknowledged) == refused
    assert api.request("GET", "/ping")[:2] == (500, f"NOK - {OUT_OF_MEMORY}".encode())

    # emptying and deleting free memory: over HTTP, and relay-admin
    assert api.request("POST", "/channel/empty?topic=t&channel=d")[0] == 200
    deleted = relay_admin(url, "delete", "t/d")
    assert (deleted.returncode, deleted.stderr) == (0, "")

    # a consumer subscribes, is given messages, REQs one, TOUCHes one, lets one time
    # out (the scanner requeues it), FINs the rest: every acknowledged one once at least
    consumer = Wire(port)
    consumer.identify(msg_timeout=1000)
    assert consumer.sub("t", "c", rdy=50) == (FRAME_RESPONSE, b"OK")
    delivered: list[bytes] = []
    kept, requeued, touched = None, False, False
    while len(set(delivered)) < len(acknowledged) or kept is not None:
        _, attempts, msg_id, got = consumer.message()
        delivered.append(got)
        if kept is None and attempts == 1 and not touched:
            kept = got                                  # let it time out
            continue
        if got == kept:
            assert attempts == 2
            kept = None
        elif not requeued:
            consumer.command(b"REQ " + msg_id + b" 0")
            requeued = True
            continue
        elif not touched:
            consumer.command(b"TOUCH " + msg_id)
            touched = True
        consumer.command(b"FIN " + msg_id)
    drained = time.monotonic()
    assert sorted(set(delivered)) == sorted(acknowledged)
    assert len(delivered) == len(acknowledged) + 2     # the REQ'd and the timed-out one

    # publishing takes again without anything restarted
    wire = Wire(port)
    while wire.pub("t", b"again") != (FRAME_RESPONSE, b"OK"):
        wire = Wire(port)
        time.sleep(0.05)
    resumed = time.monotonic() - drained
    assert consumer.message()[3] == b"again"
    assert api.request("GET", "/ping")[:2] == (200, b"OK")
    print(f"\nacknowledged={len(acknowledged)} delivered={len(set(delivered))} "
          f"lost={len(set(acknowledged) - set(delivered))} resumed_after={resumed:.3f}s")
