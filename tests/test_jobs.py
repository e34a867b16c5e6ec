"""Long admin operations: drop.lua's cut, freeing trash in chunks, admin requeue, and
the rq jobs that run them (rq's SimpleWorker in burst mode, on both backends)."""

from relay.protocol.codec import parse_record
from relay.store.keys import ChannelKeys


def queued_bodies(store, topic, channel):
    return [parse_record(r)[3] for r in store.redis.lrange(ChannelKeys.of(topic, channel).queue,
                                                           0, -1)]


def fill(store, topic, n, batch=10_000):
    for start in range(0, n, batch):
        store.publish(topic, [b"old%d" % i for i in range(start, min(n, start + batch))])


def test_drop_detaches_into_trash_and_frees_it_in_chunks(store):
    store.subscribe("t", "c", "b1")
    store.publish("t", [b"a", b"b", b"c"])
    store.publish("t", [b"later"], defer_ms=60000)
    store.deliver("t", "c", [("b1:1", 60000, 1)])

    dropped = store.detach("t", "c")
    assert dropped.last_id == 4
    assert [k.rsplit(":", 1)[1] for k in dropped.trash] == ["1", "2", "3", "4", "5"]
    assert all(k.startswith("relay:{t}:trash:") for k in dropped.trash)
    assert store.trash_sizes(dropped.trash) == [(b"list", 2), (b"zset", 1), (b"zset", 1),
                                                (b"hash", 2), (b"hash", 1)]
    c = store.read_channel("t", "c")
    assert (c["depth"], c["in_flight_count"], c["deferred_count"], c["message_count"]) == (
        0, 0, 0, 4)
    assert store.redis.zscore("relay:due", "t/c") is None
    store.publish("t", [b"after"])
    assert queued_bodies(store, "t", "c") == [b"after"]

    assert [sum(store.free_trash(k, 1)) for k in dropped.trash] == [2, 1, 1, 2, 1]
    assert store.redis.keys("relay:{t}:trash:*") == []


def test_free_trash_chunks(store):
    store.redis.rpush("relay:{t}:trash:x:1", *range(2500))
    store.redis.zadd("relay:{t}:trash:x:2", {str(i): i for i in range(2500)})
    store.redis.hset("relay:{t}:trash:x:3", mapping={str(i): i for i in range(2500)})
    assert list(store.free_trash("relay:{t}:trash:x:1", 1000)) == [1000, 1000, 500]
    assert list(store.free_trash("relay:{t}:trash:x:2", 1000)) == [1000, 1000, 500]
    chunks = list(store.free_trash("relay:{t}:trash:x:3", 1000))
    assert sum(chunks) == 2500 and len(chunks) >= 2
    assert store.redis.keys("*") == []


def test_drop_deletes_channel_and_topic(store):
    store.subscribe("t", "c", "b1")
    store.subscribe("t", "d", "b1")
    store.publish("t", [b"a"])
    assert store.detach("t", "nope", delete=True) is None
    channel = store.detach("t", "c", delete=True)
    assert store.channel_names("t") == ["d"]
    assert store.trash_sizes(channel.trash) == [(b"list", 1)]
    assert store.redis.keys("relay:{t}:ch:c:*") == []
    topic = store.detach("t", delete=True)
    assert store.trash_sizes(topic.trash) == [(b"list", 1)]
    assert store.topic_names() == []
    assert store.detach("t", delete=True) is None
    assert sorted(store.redis.keys("relay:{t}:*")) == sorted(
        [b"relay:{t}:ids", channel.trash[0].encode(), topic.trash[0].encode()])


def test_requeue_in_flight_takes_messages_from_any_holder(store):
    store.subscribe("t", "c", "b1")
    store.publish("t", [b"a", b"b", b"c"])
    store.deliver("t", "c", [("b1:1", 60000, 2), ("b2:7", 60000, 1)])
    assert store.requeue_in_flight("t", "c", [b"0000000000000001", b"0000000000000003",
                                              b"00000000000000ff"]) == [1, 1, 0]
    assert queued_bodies(store, "t", "c") == [b"a", b"c"]
    assert store.finish("t", "c", [("b1:1", b"0000000000000001")]) == [0]
    cut = store.redis.hget(ChannelKeys.of("t", "c").leases, b"0000000000000002").split()[0]
    assert store.requeue_in_flight("t", "c", [b"0000000000000002"], int(cut) - 1) == [0]
    assert store.requeue_in_flight("t", "c", [b"0000000000000002"], int(cut)) == [1]
