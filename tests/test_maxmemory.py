"""Redis at maxmemory under noeviction (issue 36): publishing is refused with its cause,
before anything is written (an MPUB all or nothing), while everything that frees memory
or only moves data goes on (lib/maxmemory.lua), and publishing takes again once
consumers have drained. On the embedded Redis 6.2 and on Valkey 8, each a server of this
module's own, as maxmemory is set on it (fakeredis has none)."""

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
from relay.codec import parse_record

SERVERS = {"redis-6.2": embedded.server_binary, "valkey-8": embedded.cluster_binary}
BODY = 1000
HEADROOM = 4_000_000    # bytes of maxmemory above what the server holds when a test starts,
                        # well above what it takes once to run what it has not run yet


@pytest.fixture(scope="module", params=sorted(SERVERS))
def server(request):
    """A server of this module's own: its client."""
    port = embedded.free_port()
    data = tempfile.mkdtemp(prefix="relay-test-maxmemory-")
    proc = embedded.start(port, data, extra=("--save", "", "--appendonly", "no"),
                          binary=SERVERS[request.param]())
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
    assert store.refusal() == OUT_OF_MEMORY
    before = store.read_channel("t", "c")
    for bodies, defer in (([body(0)], 0), ([body(0)], 60_000), ([b"big"] * 6000, 0)):
        with pytest.raises(StoreError) as refused:    # 6000: an MPUB staged first
            store.publish("t", bodies, defer)
        assert str(refused.value) == OUT_OF_MEMORY
    assert store.read_channel("t", "c") == before     # nothing of them was written
    assert int(server.get(TopicKeys.of("t").ids)) == len(acknowledged)

    # a new channel, a consumer more and less, the processes' heartbeats, the news
    joined = store.run(store.subscribe_op("t", "new", "b1"))
    assert joined.created
    assert store.run(store.unsubscribe_op("t", "new", "b1", False, False,
                                          joined.incarnation)) == 0
    assert server.hget(f"relay:{{t}}:ch:new:consumers", "b1") is None
    assert Liveness(server, keys.SCANNERS, 5_000).rank("s1") == (0, 1)
    assert store.run(Op("versions", [nodes.SINGLE + nodes.NEWS],     # HSETNX of its field
                        [TopicKeys.of("fresh").version])) == [b"0", None]
    assert store.seed_due(["t"]) == 0

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

    # emptying and deleting a channel
    store.empty_channel("t", "new")
    assert store.delete_channel("t", "new") is True

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
    assert store.refusal() is None
