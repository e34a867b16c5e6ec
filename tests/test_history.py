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


def entries(store, part="t"):
    """(entry id, its records) of each entry of a part's history: field l the lengths of
    its records; e, m and o the entries, messages and bytes before it, checked against
    the one before and the meta's counters; r the records one after the other."""
    out, before = [], None
    for entry_id, fields in store.redis.xrange(TopicKeys.of(part).history):
        assert list(fields) == [b"l", b"e", b"m", b"o", b"r"]
        records, at = [], 0
        for length in fields[b"l"].split(b" "):
            records.append(fields[b"r"][at:at + int(length)])
            at += int(length)
        assert at == len(fields[b"r"])
        counters = tuple(int(fields[k]) for k in (b"e", b"m", b"o"))
        assert before is None or counters == before
        before = (counters[0] + 1, counters[1] + len(records), counters[2] + at)
        out.append((entry_id.decode(), records))
    if out:
        meta = store.redis.hmget(TopicKeys.of(part).meta, "history_entries",
                                 "history_messages", "history_bytes")
        assert tuple(int(v) for v in meta) == before
    return out


def history(store, part="t"):
    """Every record a part's history retains, in order."""
    return [record for _, records in entries(store, part) for record in records]


def drain(store, topic, channel, n):
    """Deliver and FIN n messages, as a consumer that read everything."""
    records = store.deliver(topic, channel, [("a", 60_000, n)])[0]
    assert store.finish(topic, channel, [("a", parse_record(r)[2]) for r in records]) == [1] * n


def replay_all(store, topic, channel, **range_):
    plan = store.history.plan_replay(topic, **range_)
    return operations.run(store, "replay", topic, channel, params=plan.params)


def test_off_by_default_keeps_nothing(store):
    store.subscribe("t", "c", "")
    store.publish("t", [b"a", b"b"])
    assert store.redis.exists(TopicKeys.of("t").history) == 0
    assert store.history.retention_report("t")["on"] is False
    assert sorted(store.redis.hkeys(TopicKeys.of("t").meta)) == [b"message_bytes",
                                                                 b"message_count"]


def test_a_call_is_one_entry_of_its_records_as_queued(store):
    """Entry "<ms>-<count of its first message>" of one publish call's records, exactly
    as the channel queued them; an earlier timestamp (another broker's clock) takes the
    last entry's ms, so ids never go back."""
    store.subscribe("t", "c", "")
    store.history.set_retention("t", HOUR, 0)
    late, early = 1_800_000_000_123_456_789, 1_800_000_000_000_000_000
    store.run(store.publish_op("t", [b"one", b"two"], timestamp_ns=late))
    store.run(store.publish_op("t", [b"three"], timestamp_ns=early))
    kept = entries(store)
    assert [k[0] for k in kept] == ["1800000000123-1", "1800000000123-3"]
    assert kept[0][1] + kept[1][1] == queue(store, "t", "c")
    assert kept[0][1][0] == make_record(late, 0, mid(1), b"one")
    assert kept[1][1] == [make_record(early, 0, mid(3), b"three")]
    size = sum(len(r) for r in history(store))
    assert store.history.retained("t")[0] == (3, size, 1800000000123, 1800000000123)


def test_a_call_of_more_than_an_entry_takes_several(store):
    """An entry takes up to 64 KiB of records (one at least), or an eighth of the
    retention's max bytes if less; a bigger call takes consecutive entries."""
    store.subscribe("t", "c", "")
    store.history.set_retention("t", HOUR, 0)
    store.publish("t", [b"x" * 200] * 600)      # records of 227 B: 288 in 64 KiB
    assert [(k[0].partition("-")[2], len(k[1])) for k in entries(store)] == [
        ("1", 288), ("289", 288), ("577", 24)]
    assert history(store) == queue(store, "t", "c")
    store.history.set_retention("t", HOUR, 8 * 300)     # entries of 300 B at most; those go
    assert entries(store) == []
    store.publish("t", [b"y" * 100] * 5 + [b"z" * 400])     # 127 B each, then 427 B
    assert [(k[0].partition("-")[2], len(k[1])) for k in entries(store)] == [
        ("601", 2), ("603", 2), ("605", 1), ("606", 1)]
    assert store.history.retained("t")[0][:2] == (6, 5 * 127 + 427)


def test_trimmed_by_size_oldest_first(store):
    store.subscribe("t", "c", "")
    store.history.set_retention("t", 0, 1000)
    for i in range(20):
        store.publish("t", [b"%03d" % i + b"x" * 97])      # records of 127 bytes
    kept = history(store)
    assert [parse_record(k)[3][:3] for k in kept] == [b"%03d" % i for i in range(13, 20)]
    assert store.history.retained("t")[0].bytes == 7 * 127 == sum(len(k) for k in kept)


def test_trimmed_by_size_by_whole_entries(store):
    """A trim by size removes whole entries, oldest first: one goes when any of its
    bytes is over the limit, so what is retained stays within it, less than one entry
    under it."""
    store.subscribe("t", "c", "")
    store.history.set_retention("t", 0, 8000)           # entries of 1000 B at most
    for i in range(20):
        store.publish("t", [b"%03d" % i + b"x" * 97] * 5)  # an entry of 5 x 127 B
    kept = entries(store)
    assert len(kept) == 12 and all(len(records) == 5 for _, records in kept)
    assert parse_record(kept[0][1][0])[3][:3] == b"008"
    assert store.history.retained("t")[0][:2] == (60, 12 * 5 * 127)    # 7620 B: 8000 less 380


def test_a_trim_is_bounded_per_call(store):
    """A trim call removes at most so many entries, and about so many bytes (by time:
    XTRIM MAXLEN up to them, reading none; by size: reading them): it says when more is
    left, and trim_parts calls again until none is."""
    store.subscribe("t", "c", "")
    store.history.set_retention("t", 24 * HOUR, 0)
    old = time.time_ns() - 3 * HOUR * 10**6
    for i in range(30):
        store.run(store.publish_op("t", [b"m%d" % i] * 2, timestamp_ns=old + i * 10**6))
    store.publish("t", [b"new"])
    store.redis.hset(TopicKeys.of("t").meta, "retention_ms", HOUR)
    step = store.run(store.history.trim_op("t", entries=4))
    assert (step.trimmed, step.left, step.more) == (8, 53, True)
    step = store.run(store.history.trim_op("t", entries=1))
    assert (step.trimmed, step.left, step.more) == (2, 51, True)
    step = store.run(store.history.trim_op("t", max_bytes=100))    # entries of 2 x 29 B
    assert (step.trimmed, step.left, step.more) == (2, 49, True)
    assert store.history.trim_parts(["t"]) == 48
    assert store.run(store.history.trim_op("t")).more is False
    assert [parse_record(r)[3] for r in history(store)] == [b"new"]
    assert store.history.retained("t")[0][:2] == (1, len(history(store)[0]))

    for i in range(20):
        store.publish("t", [b"s%02d" % i] * 2)     # entries of 2 x 30 B
    store.redis.hset(TopicKeys.of("t").meta, mapping={"retention_ms": 0,
                                                      "retention_bytes": 3 * 60})
    step = store.run(store.history.trim_op("t", max_bytes=1))
    assert (step.trimmed, step.left, step.more) == (1, 40, True)   # "new"
    step = store.run(store.history.trim_op("t", entries=3))
    assert (step.trimmed, step.left, step.more) == (6, 34, True)
    assert store.history.trim_parts(["t"]) == 28
    assert [parse_record(r)[3] for r in history(store)] == [b"s17", b"s17", b"s18", b"s18",
                                                          b"s19", b"s19"]
    assert store.history.retained("t")[0][:2] == (6, 180)


def test_trimmed_by_time_when_set_and_by_the_sweep(store):
    """Entries older than the retention go when it is set (one trim call) and when
    trim_parts runs (the scanner's sweep, for topics nobody publishes to)."""
    store.subscribe("t", "c", "")
    store.history.set_retention("t", 24 * HOUR, 0)
    now = time.time_ns()
    store.run(store.publish_op("t", [b"old"], timestamp_ns=now - 3 * HOUR * 10**6))
    store.run(store.publish_op("t", [b"new"], timestamp_ns=now - 1 * HOUR * 10**6))
    assert store.history.retained("t")[0].entries == 2
    store.history.set_retention("t", 2 * HOUR, 0)
    assert [parse_record(k)[3] for k in history(store)] == [b"new"]
    store.redis.hset(TopicKeys.of("t").meta, "retention_ms", 30 * 60_000)
    assert store.history.trim_parts(["t"]) == 1
    assert store.history.retained("t")[0] == (0, 0, None, None)


def test_a_publish_trims_by_time_once_past_a_slack(store):
    """A publish trims by time once the oldest entry is older than the retention by more
    than 1% of it (1 s at most), not at every call; trim.lua (the sweep, relay-admin
    retention) trims exactly."""
    store.subscribe("t", "c", "")
    store.history.set_retention("t", 100_000, 0)       # a slack of 1 s
    now = store.now_ms()
    store.run(store.publish_op("t", [b"older"], timestamp_ns=(now - 103_000) * 10**6))
    store.run(store.publish_op("t", [b"old"], timestamp_ns=(now - 100_500) * 10**6))
    store.publish("t", [b"new"])
    assert bodies(history(store)) == [b"old", b"new"]
    assert store.history.trim_parts(["t"]) == 1
    assert bodies(history(store)) == [b"new"]


def test_off_drops_the_history(store):
    store.subscribe("t", "c", "")
    store.history.set_retention("t", HOUR, 0)
    store.publish("t", [b"a"])
    assert store.history.set_retention("t", 0, 0) == [(0, 0, None, None)]
    assert store.redis.exists(TopicKeys.of("t").history) == 0
    store.publish("t", [b"b"])
    assert store.redis.exists(TopicKeys.of("t").history) == 0


def test_replay_after_everything_was_finished(store):
    """FIN everything, rewind: the same ids, timestamps and bodies again, in publish
    order, attempts 0; one still in flight is skipped, not disturbed."""
    store.subscribe("t", "c", "")
    store.history.set_retention("t", HOUR, 0)
    store.publish("t", [b"m%d" % i for i in range(5)])
    kept = history(store)
    drain(store, "t", "c", 4)
    in_flight = store.deliver("t", "c", [("b", 60_000, 1)])[0]
    result = replay_all(store, "t", "c", from_ms=0)
    assert (result["replayed"], result["skipped"]) == (4, 1)
    assert queue(store, "t", "c") == kept[:4]
    assert store.finish("t", "c", [("b", parse_record(in_flight[0])[2])]) == [1]


def test_replay_of_a_time_range_and_from_an_id(store):
    store.subscribe("t", "c", "")
    store.history.set_retention("t", 24 * HOUR, 0)
    base = 1_800_000_000_000
    for i in range(6):      # one message a minute
        store.run(store.publish_op("t", [b"m%d" % i], timestamp_ns=(base + i * 60_000) * 10**6))
    store.history.set_retention("t", 0, 10**9)      # no time limit: those times are far back
    drain(store, "t", "c", 6)
    replay_all(store, "t", "c", from_ms=base + 60_000, to_ms=base + 3 * 60_000)
    assert bodies(queue(store, "t", "c")) == [b"m1", b"m2", b"m3"]
    drain(store, "t", "c", 3)
    replay_all(store, "t", "c", from_id=mid(5).decode())
    assert ids(queue(store, "t", "c")) == [mid(5), mid(6)]


def test_replay_from_an_id_inside_an_mpub(store):
    """--from-id of a message in the middle of an MPUB's entry starts at that message,
    and the total is exact."""
    store.subscribe("t", "c", "")
    store.history.set_retention("t", HOUR, 0)
    store.publish("t", [b"a%d" % i for i in range(10)])    # counts 1..10, one entry
    store.publish("t", [b"b%d" % i for i in range(3)])     # 11..13
    drain(store, "t", "c", 13)
    plan = store.history.plan_replay("t", from_id=mid(4).decode())
    assert (plan.size, plan.clipped) == (10, False)
    result = operations.run(store, "replay", "t", "c", params=plan.params)
    assert (result["replayed"], result["total"]) == (10, 10)
    assert ids(queue(store, "t", "c")) == [mid(i) for i in range(4, 14)]


def test_a_replay_call_takes_whole_entries(store):
    """A call reads whole entries (from a start inside one) until it has read as many
    messages as it was given, and says where it stopped and whether the range is done."""
    store.subscribe("t", "c", "")
    store.history.set_retention("t", HOUR, 0)
    for i in range(4):
        store.publish("t", [b"%d-%d" % (i, j) for j in range(5)])     # entries of 5
    drain(store, "t", "c", 20)
    kept = [k[0] for k in entries(store)]
    steps = [store.run(store.history.replay_op("t", "c", kept[0].partition("-")[0] + "-3", "+",
                                       count=4))]
    while not steps[-1].ended:
        steps.append(store.run(store.history.replay_op("t", "c", "(" + steps[-1].last, "+", count=4)))
    assert steps == [(8, 0, 8, kept[1], False), (5, 0, 5, kept[2], False),
                     (5, 0, 5, kept[3], True)]
    assert bodies(queue(store, "t", "c")) == [b"0-2", b"0-3", b"0-4"] + [
        b"%d-%d" % (i, j) for i in range(1, 4) for j in range(5)]


def test_a_cut_inside_an_entry(store):
    """A replay backward (a channel created from the beginning) up to a cut inside an
    entry takes that entry's messages up to it, in publish order."""
    store.subscribe("t", "c", "")
    store.history.set_retention("t", HOUR, 0)
    store.publish("t", [b"m%d" % i for i in range(10)])
    drain(store, "t", "c", 10)
    result = operations.run(store, "replay", "t", "c", params={"starts": ["-"], "cuts": [5]})
    assert (result["replayed"], result["total"]) == (5, 5)
    assert bodies(queue(store, "t", "c")) == [b"m%d" % i for i in range(5)]


def test_a_new_channel_from_the_beginning_gets_everything_once_in_order(store):
    """The first channel takes the backlog (published while there was no channel):
    the replay stops before it, so each message is queued once, in publish order, and
    what is published after the creation comes after."""
    store.history.set_retention("t", HOUR, 0)
    store.subscribe("t", "old", "")
    store.publish("t", [b"1", b"2"])
    store.control.delete_channel("t", "old")
    store.publish("t", [b"3"])                  # the backlog
    plan = store.history.create_from_start("t", "new")
    store.publish("t", [b"4"])
    operations.run(store, "replay", "t", "new", params=plan.params)
    assert bodies(queue(store, "t", "new")) == [b"1", b"2", b"3", b"4"]
    assert store.history.create_from_start("t", "new") is None


def test_new_topics_take_the_default_on_every_part(backend):
    """--retention-time: a topic created from now on has it on each of its partitions;
    one that exists keeps its own."""
    Store(backend).publish("before", [b"x"])
    store = Store(backend, topic_partitions=3, topic_retention_ms=HOUR)
    store.control.create_topic("after")
    store.publish("before", [b"y"])
    assert [backend.hget(TopicKeys.of(p).meta, "retention_ms")
            for p in store.parts("after")] == [b"3600000"] * 3
    assert store.history.retention("before") == (0, 0)


def test_each_part_of_a_partitioned_topic_replays_its_own(backend):
    store = Store(backend, topic_partitions=3)
    store.subscribe("p", "c", "")
    store.history.set_retention("p", HOUR, 0)
    for index in range(3):
        store.publish("p", [b"%d-%d" % (index, i) for i in range(4)], index=index)
    assert [r.entries for r in store.history.retained("p")] == [4, 4, 4]
    for index in range(3):
        drain(store, "p", "c", 4)
    result = replay_all(store, "p", "c", from_ms=0)
    assert (result["replayed"], result["total"]) == (12, 12)
    for index, part in enumerate(store.parts("p")):
        assert bodies(queue(store, part, "c")) == [b"%d-%d" % (index, i) for i in range(4)]


def test_deleting_a_topic_frees_its_history(store):
    store.subscribe("t", "c", "")
    store.history.set_retention("t", HOUR, 0)
    store.publish("t", [b"x"] * 3000)
    result = operations.run(store, "delete", "t", "")
    assert result["messages"] == 3000       # the channel's; the history is not counted
    assert all_keys(store.redis, "relay:{t}:*history*") == []
    assert all_keys(store.redis, "relay:{t}:trash*") == []
