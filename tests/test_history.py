"""Topics' histories (relay/store/history.py, lib/history.lua): retention kept in the
publish call, trimmed by time and size, replayed into a channel, and new channels from
the beginning; on fakeredis, a real Redis and a cluster (the backend fixture)."""

import time

from relay.codec import make_record, parse_record
from relay.store import Store
from relay.store.keys import TopicKeys
from tests.helpers.servers import all_keys
from tests.helpers.store import bodies, ids, mid, queue
from workers import operations

HOUR = 3_600_000


def history(store, part="t"):
    """(entry id, record, o) of each entry of a part's history."""
    return [(entry_id.decode(), fields[b"r"], int(fields[b"o"]))
            for entry_id, fields in store.redis.xrange(TopicKeys.of(part).history)]


def drain(store, topic, channel, n):
    """Deliver and FIN n messages, as a consumer that read everything."""
    records = store.deliver(topic, channel, [("a", 60_000, n)])[0]
    assert store.finish(topic, channel, [("a", parse_record(r)[2]) for r in records]) == [1] * n


def replay_all(store, topic, channel, **range_):
    plan = store.plan_replay(topic, **range_)
    return operations.run(store, "replay", topic, channel, params=plan.params)


def test_off_by_default_keeps_nothing(store):
    store.subscribe("t", "c", "")
    store.publish("t", [b"a", b"b"])
    assert store.redis.exists(TopicKeys.of("t").history) == 0
    assert store.retention_report("t")["on"] is False
    assert sorted(store.redis.hkeys(TopicKeys.of("t").meta)) == [b"message_bytes",
                                                                 b"message_count"]


def test_each_message_is_kept_as_queued_with_its_time_and_count(store):
    """Entry "<ms>-<count>", the record exactly as the channel queued it, and o the bytes
    retained through it; an earlier timestamp (another broker's clock) takes the last
    entry's ms, so ids never go back."""
    store.subscribe("t", "c", "")
    store.set_retention("t", HOUR, 0)
    late, early = 1_800_000_000_123_456_789, 1_800_000_000_000_000_000
    store.run(store.publish_op("t", [b"one", b"two"], timestamp_ns=late))
    store.run(store.publish_op("t", [b"three"], timestamp_ns=early))
    kept = history(store)
    assert [k[0] for k in kept] == ["1800000000123-1", "1800000000123-2", "1800000000123-3"]
    assert [k[1] for k in kept] == queue(store, "t", "c")
    assert kept[0][1] == make_record(late, 0, mid(1), b"one")
    assert kept[2][1] == make_record(early, 0, mid(3), b"three")
    sizes = [len(k[1]) for k in kept]
    assert [k[2] for k in kept] == [sizes[0], sizes[0] + sizes[1], sum(sizes)]
    assert store.retained("t")[0] == (3, sum(sizes), 1800000000123, 1800000000123)


def test_trimmed_by_size_oldest_first(store):
    store.subscribe("t", "c", "")
    store.set_retention("t", 0, 1000)
    for i in range(20):
        store.publish("t", [b"%03d" % i + b"x" * 97])      # records of 127 bytes
    kept = history(store)
    assert [parse_record(k[1])[3][:3] for k in kept] == [b"%03d" % i for i in range(13, 20)]
    assert store.retained("t")[0].bytes == 7 * 127 == sum(len(k[1]) for k in kept)


def test_trimmed_by_time_when_set_and_by_the_sweep(store):
    """Entries older than the retention go when it is set (one trim call) and when
    trim_parts runs (the scanner's sweep, for topics nobody publishes to)."""
    store.subscribe("t", "c", "")
    store.set_retention("t", 24 * HOUR, 0)
    now = time.time_ns()
    store.run(store.publish_op("t", [b"old"], timestamp_ns=now - 3 * HOUR * 10**6))
    store.run(store.publish_op("t", [b"new"], timestamp_ns=now - 1 * HOUR * 10**6))
    assert store.retained("t")[0].entries == 2
    store.set_retention("t", 2 * HOUR, 0)
    assert [parse_record(k[1])[3] for k in history(store)] == [b"new"]
    store.redis.hset(TopicKeys.of("t").meta, "retention_ms", 30 * 60_000)
    assert store.trim_parts(["t"]) == 1
    assert store.retained("t")[0] == (0, 0, None, None)


def test_off_drops_the_history(store):
    store.subscribe("t", "c", "")
    store.set_retention("t", HOUR, 0)
    store.publish("t", [b"a"])
    assert store.set_retention("t", 0, 0) == [(0, 0, None, None)]
    assert store.redis.exists(TopicKeys.of("t").history) == 0
    store.publish("t", [b"b"])
    assert store.redis.exists(TopicKeys.of("t").history) == 0


def test_replay_after_everything_was_finished(store):
    """FIN everything, rewind: the same ids, timestamps and bodies again, in publish
    order, attempts 0; one still in flight is skipped, not disturbed."""
    store.subscribe("t", "c", "")
    store.set_retention("t", HOUR, 0)
    store.publish("t", [b"m%d" % i for i in range(5)])
    kept = [k[1] for k in history(store)]
    drain(store, "t", "c", 4)
    in_flight = store.deliver("t", "c", [("b", 60_000, 1)])[0]
    result = replay_all(store, "t", "c", from_ms=0)
    assert (result["replayed"], result["skipped"]) == (4, 1)
    assert queue(store, "t", "c") == kept[:4]
    assert store.finish("t", "c", [("b", parse_record(in_flight[0])[2])]) == [1]


def test_replay_of_a_time_range_and_from_an_id(store):
    store.subscribe("t", "c", "")
    store.set_retention("t", 24 * HOUR, 0)
    base = 1_800_000_000_000
    for i in range(6):      # one message a minute
        store.run(store.publish_op("t", [b"m%d" % i], timestamp_ns=(base + i * 60_000) * 10**6))
    store.set_retention("t", 0, 10**9)      # no time limit: those times are far back
    drain(store, "t", "c", 6)
    replay_all(store, "t", "c", from_ms=base + 60_000, to_ms=base + 3 * 60_000)
    assert bodies(queue(store, "t", "c")) == [b"m1", b"m2", b"m3"]
    drain(store, "t", "c", 3)
    replay_all(store, "t", "c", from_id=mid(5).decode())
    assert ids(queue(store, "t", "c")) == [mid(5), mid(6)]


def test_a_new_channel_from_the_beginning_gets_everything_once_in_order(store):
    """The first channel takes the backlog (published while there was no channel):
    the replay stops before it, so each message is queued once, in publish order, and
    what is published after the creation comes after."""
    store.set_retention("t", HOUR, 0)
    store.subscribe("t", "old", "")
    store.publish("t", [b"1", b"2"])
    store.delete_channel("t", "old")
    store.publish("t", [b"3"])                  # the backlog
    plan = store.create_from_start("t", "new")
    store.publish("t", [b"4"])
    operations.run(store, "replay", "t", "new", params=plan.params)
    assert bodies(queue(store, "t", "new")) == [b"1", b"2", b"3", b"4"]
    assert store.create_from_start("t", "new") is None


def test_new_topics_take_the_default_on_every_part(backend):
    """--retention-time: a topic created from now on has it on each of its partitions;
    one that exists keeps its own."""
    Store(backend).publish("before", [b"x"])
    store = Store(backend, topic_partitions=3, topic_retention_ms=HOUR)
    store.create_topic("after")
    store.publish("before", [b"y"])
    assert [backend.hget(TopicKeys.of(p).meta, "retention_ms")
            for p in store.parts("after")] == [b"3600000"] * 3
    assert store.retention("before") == (0, 0)


def test_each_part_of_a_partitioned_topic_replays_its_own(backend):
    store = Store(backend, topic_partitions=3)
    store.subscribe("p", "c", "")
    store.set_retention("p", HOUR, 0)
    for index in range(3):
        store.publish("p", [b"%d-%d" % (index, i) for i in range(4)], index=index)
    assert [r.entries for r in store.retained("p")] == [4, 4, 4]
    for index in range(3):
        drain(store, "p", "c", 4)
    result = replay_all(store, "p", "c", from_ms=0)
    assert (result["replayed"], result["total"]) == (12, 12)
    for index, part in enumerate(store.parts("p")):
        assert bodies(queue(store, part, "c")) == [b"%d-%d" % (index, i) for i in range(4)]


def test_deleting_a_topic_frees_its_history(store):
    store.subscribe("t", "c", "")
    store.set_retention("t", HOUR, 0)
    store.publish("t", [b"x"] * 3000)
    result = operations.run(store, "delete", "t", "")
    assert result["messages"] == 3000       # the channel's; the history is not counted
    assert all_keys(store.redis, "relay:{t}:*history*") == []
    assert all_keys(store.redis, "relay:{t}:trash*") == []
