"""A Redis written by the release before the two-key in-flight layout (issue 35) is served
as it stands: messages it left in flight (member "<id>", a lease "<delivered ms> <owner>"
in the leases hash, a bare record in msgs) are finished, requeued, touched, timed out,
reaped, listed and requeued by relay-admin as before, and each is delivered once more
at most, until none is left (relay/store/scripts/lib/inflight.lua)."""

import pytest

from relay.codec import make_message
from relay.store import Store, stats
from relay.store.connection import connect
from relay.store.keys import ChannelKeys, TopicKeys
from tests.helpers.wire import FRAME_RESPONSE, Wire
from tests.helpers.store import (attempts, bodies, empty_channel, ids, mid, now_ms, queue,
                                 subscribed, wait_past)


def in_flight_before(store, topic, channel, owner, n, deadline_ms, delivered_ms):
    """Messages 1..n put in flight for `owner` as the release before did: a publish, then
    the three keys its deliver.lua wrote."""
    store.publish(topic, [b"m%d" % i for i in range(1, n + 1)])
    c = ChannelKeys.of(topic, channel)
    store.redis.delete(c.queue)
    for i in range(1, n + 1):
        record = make_message(1_000 + i, 1, mid(i), b"m%d" % i)   # the wire layout
        store.redis.hset(c.msgs, mid(i), record)
        store.redis.zadd(c.inflight, {mid(i): deadline_ms})
        store.redis.hset(c.leases, mid(i), f"{delivered_ms} {owner}")


def test_fin_req_and_touch_take_the_messages_of_the_layout_before(store):
    subscribed(store, "t", "c", "b1")
    now = now_ms(store)
    in_flight_before(store, "t", "c", "b1:1", 4, now + 60_000, now - 1_000)
    assert store.finish("t", "c", [("b1:1", mid(1)), ("b1:2", mid(2)), ("b1:1", mid(9))]) == \
        [1, -1, 0]
    [deadline] = store.touch("t", "c", [("b1:1", mid(2), 4_000)])
    assert now + 4_000 <= deadline <= now_ms(store) + 4_000
    assert store.requeue("t", "c", [("b1:1", mid(2), 0), ("b1:1", mid(3), 60_000)]) == [1, 1]
    assert store.read_channel("t", "c") == empty_channel(
        depth=1, in_flight_count=1, deferred_count=1, message_count=4, requeue_count=2,
        client_count=1)
    [again] = store.deliver("t", "c", [("b1:5", 60_000, 10)])
    assert (bodies(again), attempts(again)) == ([b"m2"], [2])
    assert store.finish("t", "c", [("b1:1", mid(4)), ("b1:5", mid(2))]) == [1, 1]
    c = ChannelKeys.of("t", "c")
    assert [store.redis.exists(k) for k in (c.inflight, c.leases)] == [0, 0]
    assert store.redis.hkeys(c.msgs) == [mid(3)]       # deferred, as REQ left it


def test_the_scanner_and_the_reaper_requeue_the_layout_before(store):
    subscribed(store, "t", "c", "b1")
    now = now_ms(store)
    in_flight_before(store, "t", "c", "b1:1", 2, now + 50, now)
    store.publish("t", [b"new"])
    store.deliver("t", "c", [("b2:1", 50, 1)])
    wait_past(store, now_ms(store) + 51)
    assert store.scan("t", "c")[:2] == (3, 0)
    assert bodies(queue(store, "t", "c")) == [b"m1", b"m2", b"new"]

    subscribed(store, "r", "c", "b9")
    in_flight_before(store, "r", "c", "b9:3", 1, now + 60_000, now)
    store.publish("r", [b"new"])
    store.deliver("r", "c", [("b9:4", 60_000, 1)])
    assert store.run(store.reap_op("r", "c", "b9")) == (0, 2)
    assert sorted(bodies(queue(store, "r", "c"))) == [b"m1", b"new"]
    for topic in ("t", "r"):
        c = ChannelKeys.of(topic, "c")
        assert not store.redis.exists(c.leases) and not store.redis.exists(c.inflight)


def test_relay_admin_lists_and_requeues_both_layouts(store):
    subscribed(store, "t", "c", "b1")
    now = now_ms(store)
    in_flight_before(store, "t", "c", "b1:1", 1, now + 60_000, now - 5)
    store.publish("t", [b"new"])
    [new] = store.deliver("t", "c", [("b2:4", 30_000, 1)])
    listed = stats.in_flight(store, "t", "c", 10)
    assert [(m["id"], m["owner"], m["attempts"]) for m in listed] == [
        (ids(new)[0].decode(), "b2:4", 1), (mid(1).decode(), "b1:1", 1)]
    assert store.requeue_in_flight("t", "c", [mid(1), ids(new)[0], mid(7)]) == [1, 1, 0]
    assert sorted(bodies(queue(store, "t", "c"))) == [b"m1", b"new"]
    assert store.finish("t", "c", [("b1:1", mid(1)), ("b2:4", ids(new)[0])]) == [0, 0]


@pytest.mark.integration
def test_a_broker_and_scanner_of_this_release_drain_what_the_release_before_left(
        processes, redis_url):
    """The upgrade as the README tells it: the old release stopped with messages queued,
    in flight (two of them timed out, one still held by a connection that is gone) and
    deferred, in its layouts (records with the id after the attempts); the new broker
    and scanner start on that Redis and a consumer gets each message once."""
    store = Store(connect(redis_url))
    subscribed(store, "up", "c", "b-old")
    now = now_ms(store)
    in_flight_before(store, "up", "c", "b-old:1", 3, now - 1_000, now - 61_000)
    c = ChannelKeys.of("up", "c")
    store.redis.zadd(TopicKeys.of("up").due, {"c": now - 1_000})
    store.publish("up", [b"m4"], defer_ms=500)
    store.publish("up", [b"m5", b"m6"])
    store.redis.rpush(c.queue, make_message(1_007, 0, mid(7), b"m7"))
    store.redis.hset(c.msgs, mid(8), make_message(1_008, 1, mid(8), b"m8"))
    store.redis.zadd(c.deferred, {mid(8): now + 300})
    store.redis.hdel(c.consumers, "b-old")      # the old broker is gone

    _, port = processes.broker()
    processes.scanner()
    consumer = Wire(port)
    assert consumer.sub("up", "c", rdy=10) == (FRAME_RESPONSE, b"OK")
    got = {}
    while len(got) < 8:
        _, tries, msg_id, body = consumer.message()
        assert msg_id not in got, body
        got[msg_id] = (body, tries)
        consumer.command(b"FIN " + msg_id)
    assert consumer.nothing(wait=1.5)
    assert sorted(got.values()) == [(b"m1", 2), (b"m2", 2), (b"m3", 2), (b"m4", 1),
                                    (b"m5", 1), (b"m6", 1), (b"m7", 1), (b"m8", 2)]
    assert [store.redis.exists(k) for k in (c.inflight, c.leases, c.msgs, c.deferred)] == \
        [0, 0, 0, 0]
