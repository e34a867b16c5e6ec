"""Bounded channels (issue 38 item 4, relay-admin limit): a channel's depth limit with
reject, drop-oldest or dead-letter, in the Store on fakeredis, Redis and a cluster (with a
partitioned topic), and against real brokers, publishers and relay-admin."""

import pytest

from relay.codec import parse_record
from relay.errors import StoreError
from relay.store import deadletter, lookup
from relay.store.data_path import INLINE_BODIES
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.limits import Limit

FULL = "channel t/c is full (max depth 3)"


def bodies(store, topic="t", channel="c") -> list[bytes]:
    """The bodies queued on the channel, oldest first, over its parts."""
    return [parse_record(r)[3] for part in store.parts(topic)
            for r in store.redis.lrange(ChannelKeys.of(part, channel).queue, 0, -1)]


def limited(store, max_depth=3, overflow="reject", channels=("c", "d")):
    for channel in channels:
        store.subscribe("t", channel, "b1")
    assert store.set_limit("t", "c", Limit(max_depth, overflow)) is True


def test_reject_refuses_a_publish_that_would_pass_the_limit_and_writes_nothing(store):
    limited(store)
    store.publish("t", [b"1", b"2"])
    ids = store.redis.get(TopicKeys.of("t").ids)
    for refused in ([b"3", b"4"], [b"x"] * (INLINE_BODIES + 1)):    # the latter staged
        with pytest.raises(StoreError) as e:
            store.publish("t", refused)
        assert str(e.value) == FULL
    assert store.redis.get(TopicKeys.of("t").ids) == ids
    assert bodies(store) == bodies(store, channel="d") == [b"1", b"2"]
    assert list(store.redis.scan_iter(match="relay:{t}:staging:*")) == []
    assert store.publish("t", [b"3"]) == 3
    with pytest.raises(StoreError, match="is full"):
        store.publish("t", [b"4"])
    assert store.read_channel("t", "c")["message_count"] == 3


def test_reject_counts_the_queue_only(store):
    """Depth as nsqd's: in flight and deferred messages are not counted, and a deferred
    publish is not refused."""
    limited(store)
    store.publish("t", [b"1", b"2", b"3"])
    store.deliver("t", "c", [("o", 60_000, 2)])
    store.publish("t", [b"later"] * 5, defer_ms=60_000)
    assert store.publish("t", [b"4", b"5"]) == 10
    assert store.read_channel("t", "c")["depth"] == 3


def test_drop_oldest_keeps_the_newest_and_counts(store):
    limited(store, overflow="drop-oldest")
    store.publish("t", [b"1", b"2", b"3", b"4", b"5"])
    store.publish("t", [b"6"])
    assert bodies(store) == [b"4", b"5", b"6"]
    assert bodies(store, channel="d") == [b"1", b"2", b"3", b"4", b"5", b"6"]
    state = store.read_channel("t", "c")
    assert (state["overflow_count"], state["message_count"]) == (3, 6)


def test_dead_letter_sends_the_oldest_to_the_outbox_with_reason_overflow(store):
    limited(store, max_depth=2, overflow="dead-letter", channels=("c",))
    store.publish("t", [b"1", b"2", b"3"])
    store.publish("t", [b"4"])
    assert bodies(store) == [b"3", b"4"]
    outbox = store.redis.lrange(ChannelKeys.of("t", "c").dead, 0, -1)
    assert [deadletter.split_entry(e)[0] for e in outbox] == ["overflow", "overflow"]
    first_id = parse_record(deadletter.split_entry(outbox[0])[1])[2]
    found = lookup.where(store, "t", "c", first_id)
    assert (found["state"], found["reason"], found["body"]) == ("dead", "overflow", b"1")
    assert store.scan("t", "c")[3] == 2       # the scanner sees it waiting
    assert deadletter.forward(store, "t", "c", "{topic}.dead") == 2
    letters = [letter for _, _, letter in deadletter.letters(store, "t", "c")]
    assert [(x["reason"], x["body"]) for x in letters] == [("overflow", "1"), ("overflow", "2")]
    assert store.read_channel("t", "c")["overflow_count"] == 2
    store.set_limit("t", "c", None)
    progress = list(deadletter.redrive(store, "t", "c"))
    assert progress[-1]["requeued"] == 2
    assert sorted(bodies(store)) == [b"1", b"2", b"3", b"4"]


def test_split_entry_tells_tagged_entries_from_records():
    record = b"\x80" + bytes(9) + b"body" + b"0" * 16 + b"\x01"
    assert deadletter.split_entry(record) == ("max_attempts", record)
    assert deadletter.split_entry(b"overflow:" + record) == ("overflow", record)
    assert deadletter.split_entry(b"expired:" + record) == ("expired", record)
    old = bytes(10) + b"0" * 16 + b"a:b"           # the layout before: first byte < 0x80
    assert deadletter.split_entry(old) == ("max_attempts", old)


def test_off_and_delete_keep_the_topic_count_of_limited_channels(store):
    limited(store)
    meta = TopicKeys.of("t").meta
    assert store.redis.hget(meta, "limited_channels") == b"1"
    store.set_limit("t", "c", Limit(5, "drop-oldest"))      # a change is no new one
    assert store.redis.hget(meta, "limited_channels") == b"1"
    assert store.limit("t", "c") == Limit(5, "drop-oldest")
    store.set_limit("t", "c", None)
    assert store.redis.hget(meta, "limited_channels") == b"0"
    assert store.limit("t", "c") is None
    store.publish("t", [b"m"] * 10)
    assert store.read_channel("t", "c")["depth"] == 10
    store.set_limit("t", "d", Limit(1, "reject"))
    assert store.delete_channel("t", "d") is True
    assert store.redis.hget(meta, "limited_channels") == b"0"
    assert store.set_limit("t", "nope", Limit(1, "reject")) is False


def test_a_partitioned_topic_holds_its_share_on_every_part(store):
    store.set_partitions("t", 2)
    limited(store, max_depth=3, channels=("c",))        # 2 per part
    for n in range(4):
        store.publish("t", [b"%d" % n])
    with pytest.raises(StoreError) as e:
        store.publish("t", [b"4"])
    assert str(e.value) == FULL
    assert len(bodies(store)) == 4
    store.set_limit("t", "c", Limit(3, "drop-oldest"))
    for n in range(4, 8):
        store.publish("t", [b"%d" % n])
    assert sorted(bodies(store)) == [b"4", b"5", b"6", b"7"]
    assert store.read_channel("t", "c")["overflow_count"] == 4
    store.set_partitions("t", 3)                        # 1 per part now, the new one too
    for part in store.parts("t"):
        meta = ChannelKeys.of(part, "c").meta
        assert store.redis.hmget(meta, "max_depth", "part_max_depth") == [b"3", b"1"]
        assert store.redis.hget(TopicKeys.of(part).meta, "limited_channels") == b"1"
    for n in range(8, 11):
        store.publish("t", [b"%d" % n])
    assert sorted(bodies(store)) == [b"10", b"8", b"9"]
