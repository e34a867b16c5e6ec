"""Every store script, on both backends (fakeredis and a real redis-server).

Asserts are on what a user or operator sees: the records a consumer gets (parsed
as the wire would), the counters of read_topic / read_channel, and raw keys.
The scanner's scripts (scan, due) are tested in test_scanner.py, the wake-ups they
publish in test_wakeups.py.
"""

import time
from importlib import resources

import fakeredis
import pytest
import redis

from relay import codec
from relay.codec import make_record, parse_record
from relay.errors import ServerTooOld, StoreError
from relay.store import Store, codes, keys, runner
from relay.store import data_path
from relay.store.keys import ChannelKeys, TopicKeys
from tests.helpers.servers import all_keys
from tests.helpers.store import (attempts, bodies, due_score, empty_channel, ids, inflight_score,
                                 holder_of, mid, now_ms, queue, subscribed, wait_past)


# -- publish and the topic backlog ----------------------------------------------

def test_publish_without_channel_goes_to_backlog(store):
    before_ns = time.time_ns()
    assert store.publish("t", [b"a", b"bc"]) == 2
    after_ns = time.time_ns()

    assert store.reads.read_topic("t") == {"message_count": 2, "message_bytes": 3, "depth": 2,
                                     "deferred_count": 0, "paused": False}
    assert store.reads.channel_names("t") == []
    assert store.reads.topic_names() == ["t"]
    backlog = store.redis.lrange(TopicKeys.of("t").backlog, 0, -1)
    parsed = [parse_record(r) for r in backlog]
    assert [(a, i, b) for _, a, i, b in parsed] == [(0, mid(1), b"a"), (0, mid(2), b"bc")]
    for ts, *_ in parsed:
        # one timestamp per call, in ns, taken when the broker accepted the publish
        assert before_ns <= ts <= after_ns
    assert parsed[0][0] == parsed[1][0]
    # no channel, so nothing for the scanners
    assert store.redis.zcard(TopicKeys.of("t").due) == 0


def test_first_channel_takes_the_whole_backlog_in_order(store):
    store.publish("t", [b"m1", b"m2"])
    t0 = now_ms(store)
    store.publish("t", [b"later"], defer_ms=60_000)
    t1 = now_ms(store)
    store.publish("t", [b"m4"])
    assert store.reads.read_topic("t") == {"message_count": 4, "message_bytes": 11, "depth": 3,
                                     "deferred_count": 1, "paused": False}
    assert store.redis.zcard(TopicKeys.of("t").due) == 0

    assert store.subscribe("t", "c1", "b1") is True

    # the backlog is gone from the topic ...
    assert store.reads.read_topic("t") == {"message_count": 4, "message_bytes": 11, "depth": 0,
                                     "deferred_count": 0, "paused": False}
    assert not store.redis.exists(TopicKeys.of("t").backlog)
    assert not store.redis.exists(TopicKeys.of("t").backlog_deferred)
    # ... and all of it is in the channel, the deferred message still deferred
    assert store.reads.read_channel("t", "c1") == empty_channel(
        depth=3, deferred_count=1, message_count=4, client_count=1)
    assert bodies(queue(store, "t", "c1")) == [b"m1", b"m2", b"m4"]
    assert ids(queue(store, "t", "c1")) == [mid(1), mid(2), mid(4)]
    due = due_score(store, "t", "c1")
    assert t0 + 60_000 <= due <= t1 + 60_000
    c = ChannelKeys.of("t", "c1")
    assert int(store.redis.zscore(c.deferred, mid(3))) == due
    assert bodies([store.redis.hget(c.msgs, mid(3))]) == [b"later"]

    got = store.deliver("t", "c1", [("o1", 60_000, 10)])
    assert [bodies(g) for g in got] == [[b"m1", b"m2", b"m4"]]
    assert attempts(got[0]) == [1, 1, 1]
    # not due yet: a scan promotes nothing
    assert store.scan("t", "c1")[1] == 0
    assert store.deliver("t", "c1", [("o1", 60_000, 10)]) == [[]]
    assert store.reads.read_channel("t", "c1")["deferred_count"] == 1


def test_second_channel_does_not_get_the_backlog(store):
    store.publish("t", [b"old"])
    store.publish("t", [b"old-deferred"], defer_ms=60_000)
    assert store.subscribe("t", "c1", "b1") is True
    assert store.subscribe("t", "c2", "b1") is True
    assert store.reads.read_channel("t", "c2") == empty_channel(client_count=1)
    assert store.reads.read_channel("t", "c1") == empty_channel(
        depth=1, deferred_count=1, message_count=2, client_count=1)
    assert store.reads.channel_names("t") == ["c1", "c2"]
    assert store.deliver("t", "c2", [("o", 60_000, 10)]) == [[]]

    # a second subscriber of an existing channel changes nothing but the count
    assert store.subscribe("t", "c1", "b1") is False
    assert store.reads.read_channel("t", "c1") == empty_channel(
        depth=1, deferred_count=1, message_count=2, client_count=2)


def test_deferred_backlog_message_promoted_when_due(store):
    store.publish("t", [b"soon"], defer_ms=40)
    subscribed(store, "t", "c")
    due = due_score(store, "t", "c")
    assert store.deliver("t", "c", [("o", 60_000, 1)]) == [[]]
    wait_past(store, due)
    assert store.scan("t", "c") == (0, 1, -1, 0)
    assert due_score(store, "t", "c") is None
    (got,) = store.deliver("t", "c", [("o", 60_000, 1)])
    assert [(a, i, b) for _, a, i, b in map(parse_record, got)] == [(1, mid(1), b"soon")]
    assert store.reads.read_channel("t", "c") == empty_channel(
        in_flight_count=1, message_count=1, client_count=1)


def test_backlog_appended_after_existing_channel_queue(store):
    """A queue left under the channel's name keeps its records first (LMOVE path)."""
    c = ChannelKeys.of("t", "c")
    leftover = make_record(1, 0, mid(99), b"leftover")
    store.redis.rpush(c.queue, leftover)
    store.publish("t", [b"a", b"b"])
    subscribed(store, "t", "c")
    assert bodies(queue(store, "t", "c")) == [b"leftover", b"a", b"b"]
    assert not store.redis.exists(TopicKeys.of("t").backlog)


def test_fan_out_to_every_channel(store):
    subscribed(store, "t", "c1")
    subscribed(store, "t", "c2", "b2")
    assert store.publish("t", [b"hello", b"world!"]) == 2
    assert store.publish("t", [b"x"]) == 3

    assert store.reads.read_topic("t") == {"message_count": 3, "message_bytes": 12, "depth": 0,
                                     "deferred_count": 0, "paused": False}
    for ch in ("c1", "c2"):
        assert store.reads.read_channel("t", ch) == empty_channel(
            depth=3, message_count=3, client_count=1)
        assert bodies(queue(store, "t", ch)) == [b"hello", b"world!", b"x"]
        assert ids(queue(store, "t", ch)) == [mid(1), mid(2), mid(3)]
    # the same records, byte for byte
    assert queue(store, "t", "c1") == queue(store, "t", "c2")

    # finishing on one channel leaves the other alone
    (got,) = store.deliver("t", "c1", [("o", 60_000, 3)])
    assert store.finish("t", "c1", [("o", i) for i in ids(got)]) == [1, 1, 1]
    assert store.reads.read_channel("t", "c1") == empty_channel(message_count=3, client_count=1)
    assert store.reads.read_channel("t", "c2")["depth"] == 3


def test_deferred_publish_fans_out_deferred(store):
    subscribed(store, "t", "c1")
    subscribed(store, "t", "c2")
    t0 = now_ms(store)
    assert store.publish("t", [b"d1", b"d2"], defer_ms=30_000) == 2
    t1 = now_ms(store)
    assert store.reads.read_topic("t") == {"message_count": 2, "message_bytes": 4, "depth": 0,
                                     "deferred_count": 0, "paused": False}
    for ch in ("c1", "c2"):
        assert store.reads.read_channel("t", ch) == empty_channel(
            deferred_count=2, message_count=2, client_count=1)
        assert store.deliver("t", ch, [("o", 60_000, 5)]) == [[]]
        due = due_score(store, "t", ch)
        assert t0 + 30_000 <= due <= t1 + 30_000
        c = ChannelKeys.of("t", ch)
        assert store.redis.zrange(c.deferred, 0, -1, withscores=True) == [
            (mid(1), due), (mid(2), due)]
        assert bodies(store.redis.hmget(c.msgs, [mid(1), mid(2)])) == [b"d1", b"d2"]


# -- ids -----------------------------------------------------------------------

def test_ids_are_16_lowercase_hex_and_consecutive_per_topic(store):
    subscribed(store, "t", "c")
    assert store.publish("t", [b"1"]) == 1
    assert store.publish("t", [b"2", b"3", b"4"]) == 4
    assert store.publish("other", [b"x"]) == 1  # every topic counts on its own
    store.redis.set(TopicKeys.of("t").ids, 0xABCDEE)
    assert store.publish("t", [b"5", b"6"]) == 0xABCDF0
    got = ids(queue(store, "t", "c"))
    assert got == [mid(1), mid(2), mid(3), mid(4), b"0000000000abcdef", b"0000000000abcdf0"]
    for i in got:
        assert len(i) == 16 and i == i.lower() and int(i, 16) > 0


def test_mpub_of_2500_is_one_call_returning_the_last_id(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"first"])
    sent = [b"m%d" % i for i in range(2500)]
    calls = []
    real_execute = store.runner._execute
    store.runner._execute = lambda ops: calls.append(len(ops)) or real_execute(ops)
    assert store.publish("t", sent) == 2501
    assert calls == [1]
    q = queue(store, "t", "c")
    assert len(q) == 2501
    assert bodies(q[1:]) == sent
    assert ids(q) == [mid(n) for n in range(1, 2502)]
    assert store.reads.read_topic("t")["message_count"] == 2501
    assert store.reads.read_channel("t", "c")["message_count"] == 2501


@pytest.mark.parametrize("with_channel", [True, False], ids=["channel", "backlog"])
def test_large_deferred_mpub_is_chunked(store, with_channel):
    """5000 deferred bodies: 10000 interleaved ZADD/HSET args, past Lua's unpack limit."""
    n = 5000
    if with_channel:
        subscribed(store, "t", "c")
    assert store.publish("t", [b"%d" % i for i in range(n)], defer_ms=60_000) == n
    if not with_channel:
        assert store.reads.read_topic("t")["deferred_count"] == n
        subscribed(store, "t", "c")
    c = ChannelKeys.of("t", "c")
    assert store.reads.read_channel("t", "c") == empty_channel(
        deferred_count=n, message_count=n, client_count=1)
    assert store.redis.hlen(c.msgs) == n
    assert bodies(store.redis.hmget(c.msgs, [mid(1), mid(n)])) == [b"0", b"%d" % (n - 1)]


def test_large_mpub_to_backlog_then_first_channel(store):
    sent = [b"%d" % i for i in range(2500)]
    assert store.publish("t", sent) == 2500
    subscribed(store, "t", "c")
    assert bodies(queue(store, "t", "c")) == sent


def test_a_call_redis_would_refuse_fails_alone(store):
    """Redis closes the connection on a command of more than 1024 * 1024 arguments, which
    failed every call of the pipeline: such a call now fails before it is sent."""
    subscribed(store, "t", "c")
    huge = store.finish_op("t", "c", [("a", mid(i)) for i in range(runner.REDIS_MAX_ARGS)])
    small = store.publish_op("t", [b"x"])
    failed, published = store.run_many([huge, small])
    assert isinstance(failed, StoreError) and "more than Redis takes" in str(failed)
    assert published == 1


def test_deliver_stops_at_its_byte_bound(store):
    """Each group may be bounded in bytes (a consumer's room for unsent messages): the
    records that would pass it stay queued, in order; the first is taken whatever its
    size, so a message bigger than the bound still goes."""
    subscribed(store, "t", "c")
    sizes = [100, 300, 250, 50, 5000, 10]
    store.publish("t", [b"x" * n for n in sizes])
    record = codec.RECORD_HEADER + 1    # a stored record's bytes besides its body
    [got] = store.deliver("t", "c", [("a", 60_000, 10, 400 + 2 * record)])
    assert [len(b) for b in bodies(got)] == [100, 300]
    [got] = store.deliver("t", "c", [("a", 60_000, 10, 1)])
    assert [len(b) for b in bodies(got)] == [250]
    [got], [rest] = (store.deliver("t", "c", [("a", 60_000, 10, 100 + 2 * record)]),
                     store.deliver("t", "c", [("b", 60_000, 10)]))
    assert [len(b) for b in bodies(got)] == [50]
    assert [len(b) for b in bodies(rest)] == [5000, 10]
    assert ids(got + rest) == [mid(4), mid(5), mid(6)]


# -- deliver -------------------------------------------------------------------

def test_deliver_fifo_and_attempts(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1", b"2", b"3", b"4", b"5"])
    (first,) = store.deliver("t", "c", [("o", 60_000, 2)])
    assert bodies(first) == [b"1", b"2"]
    assert attempts(first) == [1, 1]
    (rest,) = store.deliver("t", "c", [("o", 60_000, 10)])
    assert bodies(rest) == [b"3", b"4", b"5"]
    assert store.reads.read_channel("t", "c") == empty_channel(
        in_flight_count=5, message_count=5, client_count=1)

    # requeue -> delivered again with attempts 2; the stored copy counts the deliveries
    # before this one (codec.delivered adds it)
    assert store.requeue("t", "c", [("o", mid(1), 0)]) == [1]
    (again,) = store.deliver("t", "c", [("o2", 60_000, 10)])
    assert ids(again) == [mid(1)]
    assert attempts(again) == [2]
    timestamp, _, msg_id, body = parse_record(again[0])
    assert store.redis.hget(ChannelKeys.of("t", "c").msgs, mid(1)) == make_record(
        timestamp, 1, msg_id, body)
    assert holder_of(store, "t", "c", mid(1))[0] == "o2"
    # everything but the attempts is the published record
    assert again[0][:8] == first[0][:8] and again[0][10:] == first[0][10:]


def test_deliver_groups_get_their_own_counts_and_deadlines(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1", b"2", b"3", b"4"])
    before = now_ms(store)
    got = store.deliver("t", "c", [("a", 5_000, 2), ("b", 1_000, 3)])
    after = now_ms(store)
    assert [bodies(g) for g in got] == [[b"1", b"2"], [b"3", b"4"]]

    holders = [holder_of(store, "t", "c", i) for i in map(mid, range(1, 5))]
    assert [o for o, _ in holders] == ["a", "a", "b", "b"]
    delivered = {d - timeout for (_, d), timeout in zip(holders, [5_000, 5_000, 1_000, 1_000])}
    assert len(delivered) == 1
    (delivered,) = delivered
    assert before <= delivered <= after
    # the due index gets the earliest deadline of the call
    assert due_score(store, "t", "c") == delivered + 1_000


def test_deliver_does_not_raise_an_earlier_due_entry(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1", b"2"])
    (a,) = store.deliver("t", "c", [("a", 1_000, 1)])
    first_due = due_score(store, "t", "c")
    store.deliver("t", "c", [("a", 50_000, 1)])
    assert due_score(store, "t", "c") == first_due


def test_deliver_from_empty_queue(store):
    subscribed(store, "t", "c")
    assert store.deliver("t", "c", [("a", 1_000, 5), ("b", 1_000, 1)]) == [[], []]
    assert store.deliver("nope", "nope", [("a", 1_000, 5)]) == [[]]
    assert store.redis.zcard(TopicKeys.of("t").due) == 0
    assert store.reads.read_channel("t", "c") == empty_channel(client_count=1)


def test_deliver_within_a_large_rdy_count(store):
    """max_rdy_count has no upper bound (nsqd's neither): one client may ask for 4000."""
    subscribed(store, "t", "c")
    store.publish("t", [b"x"] * 4000)
    try:
        (got,) = store.deliver("t", "c", [("o", 60_000, 4000)])
    except StoreError:
        got = None
    # whatever happened, no message may be lost
    state = store.reads.read_channel("t", "c")
    assert state["depth"] + state["in_flight_count"] == 4000
    assert got is not None and len(got) == 4000


# -- finish --------------------------------------------------------------------

def test_finish_codes_and_cleanup(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1", b"2"])
    store.deliver("t", "c", [("a", 60_000, 1), ("b", 60_000, 1)])
    c = ChannelKeys.of("t", "c")

    # another client's message: refused, nothing changes
    assert store.finish("t", "c", [("b", mid(1))]) == [-1]
    assert store.reads.read_channel("t", "c")["in_flight_count"] == 2
    # several pairs, several owners, one call; unknown id -> 0
    assert store.finish("t", "c", [("a", mid(1)), ("b", mid(2)), ("a", b"ffffffffffffffff")]
                        ) == [1, 1, 0]
    # twice -> not in flight any more
    assert store.finish("t", "c", [("a", mid(1))]) == [0]
    for key in (c.inflight, c.msgs):
        assert not store.redis.exists(key)
    assert store.reads.read_channel("t", "c") == empty_channel(message_count=2, client_count=1)


def test_finish_of_one_id_twice_in_one_call_takes_once(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1", b"2"])
    store.deliver("t", "c", [("a", 60_000, 2)])
    assert store.finish("t", "c", [("a", mid(1)), ("a", mid(1)), ("b", mid(2)),
                                   ("a", mid(2))]) == [1, 0, -1, 1]
    assert store.reads.read_channel("t", "c")["in_flight_count"] == 0


def test_finish_of_more_ids_than_one_hmget_takes(store):
    """The members are read 1,000 per ZMSCORE: 2,500 in one call all finish."""
    subscribed(store, "t", "c")
    store.publish("t", [b"x"] * 2500)
    (got,) = store.deliver("t", "c", [("a", 60_000, 2500)])
    pairs = [("a", codec.record_id(r)) for r in got]
    assert store.finish("t", "c", pairs + [("a", b"ffffffffffffffff")]) == [1] * 2500 + [0]
    assert store.reads.read_channel("t", "c")["in_flight_count"] == 0


def test_finish_of_queued_or_deferred_message_is_not_in_flight(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1"])
    store.publish("t", [b"2"], defer_ms=60_000)
    assert store.finish("t", "c", [("a", mid(1)), ("a", mid(2))]) == [0, 0]
    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=1, deferred_count=1, message_count=2, client_count=1)


# -- requeue -------------------------------------------------------------------

def test_requeue_now_goes_to_the_tail(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1", b"2", b"3"])
    store.deliver("t", "c", [("a", 60_000, 1)])
    c = ChannelKeys.of("t", "c")

    assert store.requeue("t", "c", [("b", mid(1), 0)]) == [-1]
    assert store.requeue("t", "c", [("a", mid(9), 0)]) == [0]
    assert store.reads.read_channel("t", "c")["requeue_count"] == 0

    assert store.requeue("t", "c", [("a", mid(1), 0)]) == [1]
    assert bodies(queue(store, "t", "c")) == [b"2", b"3", b"1"]
    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=3, requeue_count=1, message_count=3, client_count=1)
    for key in (c.inflight, c.msgs):
        assert not store.redis.exists(key)
    # no longer in flight: a second requeue or a finish is refused
    assert store.requeue("t", "c", [("a", mid(1), 0)]) == [0]
    assert store.finish("t", "c", [("a", mid(1))]) == [0]


def test_requeue_with_delay_defers_until_scanned_after_due(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1", b"2"])
    store.deliver("t", "c", [("a", 60_000, 2)])
    before = now_ms(store)
    assert store.requeue("t", "c", [("a", mid(1), 150), ("a", mid(2), 0)]) == [1, 1]
    after = now_ms(store)
    c = ChannelKeys.of("t", "c")

    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=1, deferred_count=1, requeue_count=2, message_count=2, client_count=1)
    due = int(store.redis.zscore(c.deferred, mid(1)))
    assert before + 150 <= due <= after + 150
    # the channel's due entry is the requeue's (earlier than the 60 s in-flight deadline)
    assert due_score(store, "t", "c") == due
    assert store.redis.hexists(c.msgs, mid(1))
    assert store.finish("t", "c", [("a", mid(1))]) == [0]

    (got,) = store.deliver("t", "c", [("a", 60_000, 10)])
    assert ids(got) == [mid(2)]
    assert store.scan("t", "c")[:2] == (0, 0)
    assert store.deliver("t", "c", [("a", 60_000, 10)]) == [[]]

    wait_past(store, due)
    timed_out, promoted, next_due, _ = store.scan("t", "c")
    assert (timed_out, promoted) == (0, 1)
    assert next_due == inflight_score(store, "t", "c", mid(2))
    (got,) = store.deliver("t", "c", [("a", 60_000, 10)])
    assert ids(got) == [mid(1)]
    assert attempts(got) == [2]


# -- touch ---------------------------------------------------------------------

def test_touch_sets_a_new_deadline(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1"])
    store.deliver("t", "c", [("a", 1_000, 1)])
    before = now_ms(store)
    (deadline,) = store.touch("t", "c", [("a", mid(1), 30_000)])
    after = now_ms(store)
    assert before + 30_000 <= deadline <= after + 30_000
    assert holder_of(store, "t", "c", mid(1)) == ("a", deadline)


def test_touch_codes(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1", b"2"])
    store.deliver("t", "c", [("a", 1_000, 1)])
    deadline = inflight_score(store, "t", "c", mid(1))
    assert store.touch("t", "c", [("b", mid(1), 60_000), ("a", mid(2), 60_000),
                                            ("a", mid(7), 60_000)]) == [-1, 0, 0]
    assert inflight_score(store, "t", "c", mid(1)) == deadline
    assert inflight_score(store, "t", "c", mid(2)) is None
    store.finish("t", "c", [("a", mid(1))])
    assert store.touch("t", "c", [("a", mid(1), 60_000)]) == [0]
    assert not store.redis.exists(ChannelKeys.of("t", "c").inflight)


# -- unsubscribe ---------------------------------------------------------------

def incarnation(store, topic, channel):
    """The channel's incarnation, as SUB returned it to the broker."""
    return int(store.redis.hget(ChannelKeys.of(topic, channel).meta, "incarnation"))


def test_consumer_counts_per_broker(store):
    c = ChannelKeys.of("t", "c")
    assert store.subscribe("t", "c", "b1") is True
    assert store.subscribe("t", "c", "b1") is False
    assert store.subscribe("t", "c", "b2") is False
    assert store.redis.hgetall(c.consumers) == {b"b1": b"2", b"b2": b"1"}
    assert store.reads.read_channel("t", "c")["client_count"] == 3
    unsub = store.unsubscribe_op("t", "c", "b1", False, False, incarnation(store, "t", "c"))
    assert store.run(unsub) == 0
    assert store.redis.hgetall(c.consumers) == {b"b1": b"1", b"b2": b"1"}
    assert store.run(unsub) == 0
    assert store.redis.hgetall(c.consumers) == {b"b2": b"1"}
    assert store.run(store.unsubscribe_op("t", "c", "b2", False, False, incarnation(store, "t", "c"))) == 0
    assert not store.redis.exists(c.consumers)
    assert store.reads.read_channel("t", "c")["client_count"] == 0


def test_non_ephemeral_channel_kept_when_last_consumer_leaves(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1", b"2"])
    store.deliver("t", "c", [("a", 60_000, 1)])
    assert store.run(store.unsubscribe_op("t", "c", "b1", False, False, incarnation(store, "t", "c"))) == 0
    assert store.reads.channel_names("t") == ["c"]
    assert due_score(store, "t", "c") is not None
    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=1, in_flight_count=1, message_count=2)
    # a later publish still reaches it
    store.publish("t", [b"3"])
    assert store.reads.read_channel("t", "c")["depth"] == 2


def test_ephemeral_channel_deleted_when_last_consumer_leaves(store):
    ch = "c#ephemeral"
    subscribed(store, "t", "keep")
    subscribed(store, "t", ch, "b1")
    store.subscribe("t", ch, "b2")
    store.publish("t", [b"1", b"2", b"3"])
    store.publish("t", [b"4"], defer_ms=60_000)
    store.deliver("t", ch, [("a", 60_000, 1)])
    store.requeue("t", ch, [("a", mid(1), 60_000)])
    store.deliver("t", ch, [("a", 60_000, 1)])
    c = ChannelKeys.of("t", ch)
    store.redis.rpush(c.dead, b"a dead letter not forwarded yet")
    store.redis.set(c.dead_lock, "a scanner")
    store.redis.hset(c.gate, "key", mid(2))     # as an ordered channel has them
    store.redis.hset(c.key_of, mid(2), "key")
    store.redis.zadd(c.waiting, {b"key " + mid(3) + b" 0 record": 0})
    store.redis.hset(c.urgent, "4", 1)      # as a channel with an urgent message has it
    store.redis.rpush(c.urgent_list(4), b"an urgent record")
    assert all(store.redis.exists(k) for k in c.all())
    assert due_score(store, "t", ch) is not None

    # a consumer on another broker keeps it alive
    assert store.run(store.unsubscribe_op("t", ch, "b1", True, False, incarnation(store, "t", ch))) == 0
    assert store.reads.channel_names("t") == ["c#ephemeral", "keep"]
    assert store.run(store.unsubscribe_op("t", ch, "b2", True, False, incarnation(store, "t", ch))) == 1

    assert [k for k in [*c.all(), c.urgent_list(4)] if store.redis.exists(k)] == []
    assert store.reads.channel_names("t") == ["keep"]
    assert due_score(store, "t", ch) is None
    assert store.reads.read_channel("t", ch) == empty_channel()
    # the topic and its other channel are untouched
    assert store.reads.read_topic("t")["message_count"] == 4
    assert store.reads.read_channel("t", "keep")["depth"] == 3
    # publishing again does not resurrect it
    store.publish("t", [b"5"])
    assert not store.redis.exists(c.queue)


def test_ephemeral_topic_deleted_with_its_last_ephemeral_channel(store):
    topic = "t#ephemeral"
    t = TopicKeys.of(topic)
    subscribed(store, topic, "a#ephemeral")
    subscribed(store, topic, "b#ephemeral")
    store.publish(topic, [b"1"])
    assert store.run(store.unsubscribe_op(topic, "a#ephemeral", "b1", True, True, incarnation(store, topic, "a#ephemeral"))) == 1
    assert store.reads.read_topic(topic)["message_count"] == 1
    assert store.run(store.unsubscribe_op(topic, "b#ephemeral", "b1", True, True, incarnation(store, topic, "b#ephemeral"))) == 2
    assert not store.redis.exists(t.meta)
    assert not store.redis.exists(t.channels)
    assert store.redis.zcard(TopicKeys.of("t").due) == 0
    assert store.reads.read_topic(topic) == {"message_count": 0, "message_bytes": 0, "depth": 0,
                                       "deferred_count": 0, "paused": False}
    # the registry is the caller's to update; ids are never reused
    assert store.reads.topic_names() == [topic]
    store.control.forget_topic(topic)
    assert store.reads.topic_names() == []
    assert store.redis.get(t.ids) == b"1"
    left = sorted(k for k in all_keys(store.redis, f"{keys.topic_prefix(topic)}*"))
    assert left == [t.ids.encode(), t.version.encode()]


def test_ephemeral_topic_kept_while_a_durable_channel_remains(store):
    topic = "t#ephemeral"
    subscribed(store, topic, "durable")
    subscribed(store, topic, "e#ephemeral")
    store.publish(topic, [b"1"])
    assert store.run(store.unsubscribe_op(topic, "e#ephemeral", "b1", True, True, incarnation(store, topic, "e#ephemeral"))) == 1
    assert store.run(store.unsubscribe_op(topic, "durable", "b1", False, True, incarnation(store, topic, "durable"))) == 0
    assert store.reads.channel_names(topic) == ["durable"]
    assert store.reads.read_topic(topic)["message_count"] == 1


# -- a channel's incarnation and empties -------------------------------------

def test_incarnation_and_empties_tell_a_channel_deleted_or_emptied(store):
    first = store.run(store.subscribe_op("t", "c", "b1"))
    assert first.created and store.reads.channel_states([("t", "c")]) == [(first.incarnation, 0)]
    again = store.run(store.subscribe_op("t", "c", "b2"))
    assert (again.created, again.incarnation, again.empties) == (False, first.incarnation, 0)
    store.publish("t", [b"1", b"2"])
    assert store.deliver("t", "c", [("a", 60_000, 1)]).empties == 0
    store.control.empty_channel("t", "c")
    assert store.reads.channel_states([("t", "c")]) == [(first.incarnation, 1)]
    store.publish("t", [b"3"])
    delivered = store.deliver("t", "c", [("a", 60_000, 5)])
    assert (bodies(delivered[0]), delivered.empties) == ([b"3"], 1)
    store.control.delete_channel("t", "c")
    assert store.reads.channel_states([("t", "c")]) == [(None, 0)]
    recreated = store.run(store.subscribe_op("t", "c", "b1"))
    assert recreated.created and recreated.incarnation > first.incarnation
    # a consumer of the deleted incarnation leaving does not count in the new one
    assert store.run(store.unsubscribe_op("t", "c", "b1", False, False,
                                          first.incarnation)) == 0
    assert store.reads.read_channel("t", "c")["client_count"] == 1


# -- scripts, errors -----------------------------------------------------------

def lua_lib(name: str) -> bytes:
    """A lib file as loaded: its codes' values in place of their names."""
    return codes.inline((resources.files("relay.store") / "scripts" / "lib" / name).read_bytes())


def test_lua_record_layout_is_relay_codecs(store):
    """record.lua's helpers agree with relay/codec.py on stored records."""
    script = lua_lib("record.lua") + b"""
        local r = ARGV[1]
        return {record_attempts(r), record_id(r), with_attempts(r, 65535),
                new_record(string.sub(r, 1, 8), record_id(r), 'x', 0x1ff)}
        """
    record = make_record(0x0102030405060708, 0x0203, b"00000000000000ff", b"body")
    assert store.redis.eval(script, 0, record) == [
        0x0203, b"00000000000000ff",
        make_record(0x0102030405060708, 65535, b"00000000000000ff", b"body"),
        make_record(0x0102030405060708, 0, b"00000000000000ff", b"x")]


def test_lua_message_ids_of_a_run_of_counts_are_each_counts_id(store):
    """message_ids makes a count's id from a head per 16 counts and priority: across
    the 16s and a carry of many digits, with and without priorities, each is the id of
    its count (priority digit, part in 3, count in 12)."""
    script = lua_lib("record.lua") + b"""
        local priorities = ARGV[4] ~= '' and {} or nil
        for i = 1, #ARGV[4] do priorities[i] = tonumber(string.sub(ARGV[4], i, i)) end
        return message_ids(tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), priorities)
        """
    first = 0xffffffff - 20
    levels = [0, 5, 0, 9, 9, 1] * 7
    assert store.redis.eval(script, 0, 0x2a, first, 40, "") == [
        b"002a%012x" % count for count in range(first, first + 40)]
    assert store.redis.eval(script, 0, 7, first, 40, "".join(map(str, levels))) == [
        b"%x007%012x" % (level, first + i) for i, level in enumerate(levels[:40])]


def test_the_library_defines_each_lib_file_once_before_its_functions():
    """Every lib file is in the library once, after what it names (news.lua names
    node.lua), before the functions; each script is a function named with the library's
    hash, its file in it as it is, the codes' values in place of their names
    (relay/store/codes.py). The sharded library has SPUBLISH where the plain one has
    PUBLISH, and a name of its own."""
    plain, sharded = runner.load_library(), runner.load_library(sharded=True)
    code = plain.code.encode()
    functions_start = code.index(b"redis.register_function")
    folder = resources.files("relay.store") / "scripts"
    for lib in (folder / "lib").iterdir():
        assert code.count(lua_lib(lib.name)) == 1, lib.name
        assert code.index(lua_lib(lib.name)) < functions_start, lib.name
    assert code.index(lua_lib("node.lua")) < code.index(lua_lib("news.lua"))
    own = (folder / "publish.lua").read_bytes()
    assert own.startswith(b"-- include: append.lua, dedup.lua\n")
    assert codes.inline(own) in code
    digest = plain.name.removeprefix("relay_")
    assert sorted(plain.scripts) == sorted(p.name[:-4] for p in folder.iterdir()
                                           if p.name.endswith(".lua"))
    assert {s.function for s in plain.scripts.values()} == \
        {f"{name}_{digest}" for name in plain.scripts}
    assert sharded.code.replace(sharded.name, plain.name).replace(
        sharded.name.removeprefix("relay_"), digest) == \
        plain.code.replace("redis.call('PUBLISH', wake", "redis.call('SPUBLISH', wake")
    assert "'PUBLISH'" not in sharded.code and sharded.name != plain.name


def test_functions_reach_other_slots_and_only_publishing_is_refused_at_maxmemory(store):
    """Every function may reach keys of other slots of its node (the node keys:
    relay/store/nodes.py); all but the publishing ones run at maxmemory (allow-oom),
    where those are refused before they write anything (tests/test_maxmemory.py)."""
    store.runner.load_library()
    refused = {"publish", "publish_commit", "stage", "redrive", "replay"}
    for server in servers(store):   # every master of a cluster
        (library,) = server.function_list(library=store.runner.library.name)
        listed = dict(zip(library[::2], library[1::2]))
        flags = {}
        for function in listed[b"functions"]:
            fields = dict(zip(function[::2], function[1::2]))
            flags[fields[b"name"].decode()] = {flag.decode() for flag in fields[b"flags"]}
        assert flags == {s.function: {"allow-cross-slot-keys"} if s.name in refused
                         else {"allow-cross-slot-keys", "allow-oom"}
                         for s in store.runner.library.scripts.values()}


def servers(store) -> list:
    """The store's server, or each master of its cluster, as a client of its own."""
    if not store.cluster:
        return [store.redis]
    return [store.redis.get_redis_connection(node) for node in store.redis.get_primaries()]


@pytest.mark.parametrize("second_delay", [0, 60_000])
def test_an_id_requeued_twice_in_one_call_goes_back_once(store, second_delay):
    """Merged REQs may name one id twice: the first takes it, the second finds it gone."""
    subscribed(store, "t", "c")
    store.publish("t", [b"1"])
    store.deliver("t", "c", [("a", 60_000, 1)])
    assert store.requeue("t", "c", [("a", mid(1), 0), ("a", mid(1), second_delay)]) == [1, 0]
    assert bodies(queue(store, "t", "c")) == [b"1"]
    assert store.reads.read_channel("t", "c")["deferred_count"] == 0
    assert store.reads.read_channel("t", "c")["requeue_count"] == 1


def test_includes_are_resolved_recursively_each_once():
    """finish.lua names lib/finish.lua, which names chunked.lua, inflight.lua (which
    names chunked.lua too, record.lua and decimal.lua) and order.lua (which names time.lua, news.lua,
    which names node.lua, record.lua and queue.lua); deliver.lua names finish.lua and chunked.lua, and gets each once, in an
    order where every file comes after what it uses."""
    folder = resources.files("relay.store") / "scripts"
    own = (folder / "finish.lua").read_bytes()
    assert own.startswith(b"-- include: finish.lua\n")
    raw = {name: (folder / "lib" / name).read_bytes() for name in (
        "chunked.lua", "inflight.lua", "time.lua", "node.lua", "news.lua", "order.lua",
        "finish.lua", "record.lua", "queue.lua", "decimal.lua")}
    assert runner.with_includes(folder / "lib", own, set()) == b"".join(raw[n] for n in (
        "chunked.lua", "record.lua", "decimal.lua", "inflight.lua", "time.lua", "node.lua",
        "news.lua", "queue.lua", "order.lua", "finish.lua")) + own
    deliver = runner.with_includes(folder / "lib", (folder / "deliver.lua").read_bytes(), set())
    for lib in ("time.lua", "chunked.lua", "record.lua", "inflight.lua", "finish.lua"):
        assert deliver.count(raw[lib]) == 1, lib
    assert deliver.index(raw["inflight.lua"]) < deliver.index(raw["finish.lua"])


def test_lua_channel_key_suffixes_are_the_key_schemas(store):
    """fanout.lua finds a channel's keys by their place in keys.CHANNEL_SUFFIXES."""
    got = store.redis.eval(lua_lib("fanout.lua") + b"""
        local out = {}
        for name, place in pairs(SUFFIX) do out[#out + 1] = {name, place} end
        return out
        """, 0, 0)
    places = {name.decode().replace("dead_lock", "dead:lock"): place for name, place in got}
    assert places == {s: i for i, s in enumerate(keys.CHANNEL_SUFFIXES, 1)}


def loaded(store) -> bool:
    """Whether the store's server (every master of a cluster) holds its library."""
    return all(server.function_list(library=store.runner.library.name)
               for server in servers(store))


def test_the_library_is_loaded_again_after_function_flush(store):
    subscribed(store, "t", "c")
    assert store.publish("t", [b"1"]) == 1
    assert loaded(store)

    store.redis.function_flush()
    assert not loaded(store)
    # several ops in one pipeline, all failing "Function not found", all retried once
    results = store.run_many([
        store.publish_op("t", [b"2", b"3"]),
        store.subscribe_op("t", "c2", "b1"),
        store.deliver_op("t", "c", [("a", 60_000, 10)]),
    ])
    assert results[0] == 3
    assert results[1].created is True
    assert bodies(results[2][0]) == [b"1", b"2", b"3"]
    assert loaded(store)
    # each op ran exactly once
    assert store.reads.read_channel("t", "c")["in_flight_count"] == 3
    assert store.reads.read_channel("t", "c2") == empty_channel(client_count=1)
    assert store.reads.read_topic("t")["message_count"] == 3


def test_a_fresh_store_loads_the_library(store):
    store.redis.function_flush()
    fresh = type(store)(store.redis)
    assert fresh.publish("t", [b"x"]) == 1


def test_a_library_already_there_is_not_compiled_again(single_redis_url):
    """Each Store looks for the library before its first call, and loads it only where a
    library of its name (its code's hash) is not there: loading compiles it again, 4.5 ms
    of Redis for every Store made (each relay-admin command, each lane)."""
    client = redis.Redis.from_url(single_redis_url)
    Store(client).run(Store(client).subscribe_op("t", "c", "b"))
    client.config_resetstat()
    assert Store(client).publish("t", [b"x"]) == 1
    assert "cmdstat_function|load" not in client.info("commandstats")


def test_a_server_without_functions_is_refused_in_one_line():
    """Redis 6.2 has no FUNCTION: relay says what it needs (fakeredis as Redis 6.2)."""
    old = fakeredis.FakeRedis(version=(6, 2))
    with pytest.raises(ServerTooOld) as refused:
        Store(old).publish("t", [b"x"])
    assert str(refused.value) == runner.NEEDS_FUNCTIONS


def test_a_channel_read_that_redis_refuses_is_a_store_error(store):
    """Among replies read without looking at each (resp.Replies), an error still fails
    the read: /stats answers 500, not figures made of an error."""
    subscribed(store, "t", "good")
    store.redis.set(ChannelKeys.of("t", "bad").queue, b"not a list")
    with pytest.raises(StoreError, match="WRONGTYPE"):
        store.reads.read_channels([(["t"], "good"), (["t"], "bad")])
    assert store.reads.read_channel("t", "good")["client_count"] == 1


def test_script_error_is_a_store_error_for_that_op_only(store):
    store.redis.set(ChannelKeys.of("t", "bad").queue, b"not a list")
    subscribed(store, "t", "good")
    store.publish("t", [b"x"])
    results = store.run_many([
        store.deliver_op("t", "bad", [("a", 1_000, 1)]),
        store.deliver_op("t", "good", [("a", 1_000, 1)]),
    ])
    assert isinstance(results[0], StoreError)
    # the error as Redis gives it, without the function's name or line (causes.py)
    assert str(results[0]) == "WRONGTYPE Operation against a key holding the wrong kind of value"
    assert bodies(results[1][0]) == [b"x"]
    with pytest.raises(StoreError):
        store.deliver("t", "bad", [("a", 1_000, 1)])


def test_reads_of_unknown_topic_and_channel(store):
    assert store.reads.read_topic("nope") == {"message_count": 0, "message_bytes": 0, "depth": 0,
                                        "deferred_count": 0, "paused": False}
    assert store.reads.read_channel("nope", "nope") == empty_channel()
    assert store.reads.channel_names("nope") == []
    assert store.reads.topic_names() == []
    assert store.reads.due_channels()[1] == []


def test_empty_and_delete(store):
    store.subscribe("t", "c", "b1")
    store.subscribe("t", "d", "b1")
    store.publish("t", [b"a", b"b"])
    store.publish("t", [b"later"], defer_ms=60000)
    store.deliver("t", "c", [("b1:1", 60000, 1)])
    store.control.empty_channel("t", "c")
    c = store.reads.read_channel("t", "c")
    assert (c["depth"], c["in_flight_count"], c["deferred_count"], c["message_count"]) == (
        0, 0, 0, 3)
    assert store.redis.zscore(TopicKeys.of("t").due, "c") is None
    assert store.redis.zscore(TopicKeys.of("t").due, "d") is not None
    assert store.reads.read_channel("t", "d")["depth"] == 2
    assert store.control.delete_channel("t", "c") is True
    assert store.control.delete_channel("t", "c") is False
    assert store.reads.channel_names("t") == ["d"]
    assert store.control.delete_topic("t") is True
    assert store.control.delete_topic("t") is False
    assert store.reads.topic_names() == []
    assert all_keys(store.redis, "relay:{t}:ch:*") == []
    store.control.create_topic("t")
    store.publish("t", [b"x"])
    assert store.reads.read_topic("t")["depth"] == 1
    store.control.empty_topic("t")
    assert store.reads.read_topic("t")["depth"] == 0


def test_paused_channel_delivers_nothing_until_unpaused(store):
    store.subscribe("t", "c", "b1")
    store.subscribe("t", "d", "b1")
    store.control.pause_channel("t", "c", True)
    store.publish("t", [b"a", b"b"])
    assert store.deliver("t", "c", [("b1:1", 60000, 5), ("b1:2", 60000, 5)]) == [[], []]
    assert store.reads.read_channel("t", "c")["paused"] is True
    assert store.reads.read_channel("t", "c")["depth"] == 2
    assert [r[26:] for r in store.deliver("t", "d", [("b1:1", 60000, 5)])[0]] == [b"a", b"b"]
    store.control.pause_channel("t", "c", False)
    assert store.reads.read_channel("t", "c")["paused"] is False
    assert [r[26:] for r in store.deliver("t", "c", [("b1:1", 60000, 5)])[0]] == [b"a", b"b"]


def test_deliver_many_does_each_channels_deliver_in_one_call(store):
    """A wake-up of a topic with many channels on one broker delivers to all of them in
    one call: each channel gets what its own deliver call would have given, paused ones
    nothing, and each says for itself whether its queue has more and its empties."""
    for channel in ("a", "b", "c", "d"):
        store.subscribe("t", channel, "b1")
    store.control.pause_channel("t", "c", True)
    store.publish("t", [b"1", b"2", b"3"])
    store.control.empty_channel("t", "d")
    store.publish("t", [b"4"])
    before = now_ms(store)
    got = store.run(store.deliver_many_op("t", [
        ("a", [("b1:1", 60_000, 1, 0), ("b1:2", 1_000, 5, 0)]),
        ("b", [("b1:3", 60_000, 3, 0)]),
        ("c", [("b1:4", 60_000, 5, 0)]),
        ("d", [("b1:5", 60_000, 5, 0)])]))
    assert [[bodies(g) for g in d] for d in got] == [
        [[b"1"], [b"2", b"3", b"4"]], [[b"1", b"2", b"3"]], [[]], [[b"4"]]]
    assert [(d.more, d.empties, d.finished) for d in got] == [
        (False, 0, []), (True, 0, []), (False, 0, []), (False, 1, [])]
    assert attempts(got[0][1]) == [1, 1, 1]
    assert holder_of(store, "t", "a", mid(1))[0] == "b1:1"
    assert holder_of(store, "t", "b", mid(3))[0] == "b1:3"
    assert before + 1_000 <= due_score(store, "t", "a") <= now_ms(store) + 1_000
    assert store.reads.read_channel("t", "b")["in_flight_count"] == 3
    assert store.reads.read_channel("t", "c")["depth"] == 4


def test_paused_topic_keeps_messages_until_unpaused(store):
    store.subscribe("t", "c", "b1")
    store.subscribe("t", "d", "b1")
    store.control.pause_topic("t", True)
    store.publish("t", [b"a", b"b"])
    store.publish("t", [b"later"], defer_ms=60000)
    assert store.reads.read_topic("t")["paused"] is True
    assert (store.reads.read_topic("t")["depth"], store.reads.read_topic("t")["deferred_count"]) == (2, 1)
    assert store.reads.read_channel("t", "c")["depth"] == 0
    assert store.subscribe("t", "e", "b1") is True
    assert store.reads.read_topic("t")["depth"] == 2
    store.control.pause_topic("t", False)
    assert store.reads.read_topic("t") == {"message_count": 3, "message_bytes": 7, "depth": 0,
                                     "deferred_count": 0, "paused": False}
    for channel in ("c", "d", "e"):
        c = store.reads.read_channel("t", channel)
        assert (c["depth"], c["deferred_count"], c["message_count"]) == (2, 1, 3)
    assert [r[26:] for r in store.deliver("t", "c", [("b1:1", 60000, 5)])[0]] == [b"a", b"b"]


def test_an_unpause_moves_a_backlog_in_steps_and_a_pause_between_them_stops_it(store):
    """50 channels make a step 200 records (pause_topic.lua): a backlog of 450 takes
    three calls, none holding Redis for the whole of it."""
    channels = [f"c{i:03}" for i in range(50)]
    for channel in channels:
        store.subscribe("t", channel, "b1")
    store.control.pause_topic("t", True)
    for start in range(0, 450, 150):
        store.publish("t", [b"%d" % i for i in range(start, start + 150)])
    store.publish("t", [b"due"], defer_ms=60_000)
    t = keys.TopicKeys.of("t")

    def step(mode):
        return store.run(store.fanout_op(
            "pause_topic", "t", [t.meta, t.channels, t.backlog, t.backlog_deferred, t.due,
                                 t.version], [mode, t.wake, store.node("t")]))

    assert step("0") == codes.MORE
    assert store.reads.read_topic("t")["paused"] is True
    assert (store.reads.read_topic("t")["depth"], store.reads.read_topic("t")["deferred_count"]) == (250, 0)
    store.publish("t", [b"late"])
    store.control.pause_topic("t", True)
    assert step("step") == codes.DONE
    assert store.reads.read_topic("t")["depth"] == 251
    store.control.pause_topic("t", False)
    assert store.reads.read_topic("t")["paused"] is False
    assert store.reads.read_topic("t")["depth"] == 0
    for channel in ("c000", "c049"):
        c = store.reads.read_channel("t", channel)
        assert (c["depth"], c["deferred_count"], c["message_count"]) == (451, 1, 452)
        got = store.deliver("t", channel, [("b1:1", 60_000, 500)])[0]
        assert [r[26:] for r in got] == [b"%d" % i for i in range(450)] + [b"late"]


def test_deliver_says_whether_the_queue_has_more(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1", b"2"])
    first = store.run(store.deliver_op("t", "c", [("a", 60_000, 1)]))
    second = store.run(store.deliver_op("t", "c", [("a", 60_000, 1)]))
    third = store.run(store.deliver_op("t", "c", [("a", 60_000, 1)]))
    assert [(len(d[0]), d.more) for d in (first, second, third)] == [
        (1, True), (1, False), (0, False)]
