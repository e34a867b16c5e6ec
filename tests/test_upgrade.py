"""Data of layout 1 (before issue 35), which this release does not read, is found by
relay/store/layout_one.py, naming the first leftover: a leases hash beside an in-flight
set, a record in the wire layout where records are stored, news counted only in a
version key. A Redis of layout 2 alone, whatever it holds, has none. Store tests run on
fakeredis, one Redis and the cluster."""

from relay.codec import make_message
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.layout_one import find_layout_one
from tests.helpers.store import mid, now_ms, subscribed


def old_record(n: int) -> bytes:
    """A record as layout 1 stored it: the wire layout, no mark in its timestamp."""
    return make_message(1_000 + n, 1, mid(n), b"m%d" % n)


def test_a_leases_hash_is_found(store):
    subscribed(store, "t", "c")
    c = ChannelKeys.of("t", "c")
    for i in (1, 2, 3):
        store.redis.hset(c.msgs, mid(i), old_record(i))
        store.redis.zadd(c.inflight, {mid(i): now_ms(store) + 60_000})
        store.redis.hset(f"{c.msgs[:-len('msgs')]}leases", mid(i), f"{now_ms(store)} b1:1")
    assert find_layout_one(store.redis) in (
        "relay:{t}:ch:c:leases (3 messages in flight of layout 1)",
        "a record of layout 1 in relay:{t}:ch:c:msgs")
    store.redis.delete(c.msgs)
    assert find_layout_one(store.redis) == \
        "relay:{t}:ch:c:leases (3 messages in flight of layout 1)"


def test_an_old_record_in_a_queue_is_found_behind_new_ones(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"%d" % i for i in range(2_500)])    # past one chunk
    assert find_layout_one(store.redis) is None
    store.redis.rpush(ChannelKeys.of("t", "c").queue, old_record(1))
    assert find_layout_one(store.redis) == "a record of layout 1 in relay:{t}:ch:c:queue"


def test_an_old_deferred_record_is_found(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"new"], defer_ms=60_000)
    c = ChannelKeys.of("t", "c")
    store.redis.hset(c.msgs, mid(7), old_record(7))
    store.redis.zadd(c.deferred, {mid(7): now_ms(store) + 60_000})
    assert find_layout_one(store.redis) == "a record of layout 1 in relay:{t}:ch:c:msgs"


def test_an_old_record_in_a_dead_letter_outbox_is_found_plain_or_tagged(store):
    subscribed(store, "t", "c")
    dead = ChannelKeys.of("t", "c").dead
    store.redis.rpush(dead, old_record(1))
    assert find_layout_one(store.redis) == "a record of layout 1 in relay:{t}:ch:c:dead"
    store.redis.delete(dead)
    store.redis.rpush(dead, b"expired:" + old_record(2))
    assert find_layout_one(store.redis) == "a record of layout 1 in relay:{t}:ch:c:dead"


def test_an_old_record_in_a_backlog_is_found(store):
    store.publish("b", [b"new"])                     # no channel: the backlog
    assert find_layout_one(store.redis) is None
    store.redis.rpush(TopicKeys.of("b").backlog, old_record(1))
    assert find_layout_one(store.redis) == "a record of layout 1 in relay:{b}:backlog"
    store.redis.delete(TopicKeys.of("b").backlog)
    store.redis.zadd(TopicKeys.of("b").backlog_deferred, {old_record(2): now_ms(store)})
    assert find_layout_one(store.redis) == \
        "a record of layout 1 in relay:{b}:backlog:deferred"


def test_news_in_a_version_key_alone_is_found(store):
    store.redis.hset(TopicKeys.of("old").version, "news", 41)
    news = store.node("old") + "news"
    assert find_layout_one(store.redis) == \
        f"relay:{{old}}:version (news of layout 1: no {news} on its node)"


def test_a_redis_of_layout_2_has_none(store):
    """Topics, channels, messages queued, in flight, deferred and dead, an ordered
    channel with a message out and one waiting, a topic without channels, news."""
    subscribed(store, "t", "c")
    subscribed(store, "t", "d")
    store.publish("t", [b"%d" % i for i in range(20)])
    store.publish("t", [b"later"], defer_ms=60_000)
    store.deliver("t", "c", [("b1:1", 60_000, 5)])
    [[held]] = store.deliver("t", "d", [("b1:2", 60_000, 1)])
    assert store.requeue("t", "d", [("b1:2", held[10:26], 30_000)]) == [1]
    store.control.configure_channel("t", "c", "max_attempts", 1)
    c = ChannelKeys.of("t", "c")
    for member in store.redis.zrange(c.inflight, 0, -1):      # timed out: back, counted
        store.redis.zadd(c.inflight, {member: 0})
    assert store.scan("t", "c")[0] == 5
    store.deliver("t", "c", [("b1:1", 60_000, 20)])          # past max attempts: dead
    assert store.redis.llen(c.dead) == 5
    subscribed(store, "o", "c")
    store.ordering.set_ordered("o", "c", True)
    store.dedup.publish_keyed("o", [b"1", b"2"], None, order_keys=[b"k", b"k"])
    store.deliver("o", "c", [("b1:3", 60_000, 1)])
    store.publish("nochannel", [b"kept"])
    store.control.pause_channel("t", "d", True)
    assert store.reads.versions(["t", "o"])["t"] > 0
    assert find_layout_one(store.redis) is None
