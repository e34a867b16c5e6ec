"""Ordered channels at the Store (relay/store/ordering.py, lib/order.lua), on fakeredis
and on the embedded redis-server: one key's messages out one at a time in publish order,
through every way a message is requeued or leaves; different keys and unkeyed messages
in parallel; nothing left of a key once its messages are gone."""

import zlib

import pytest

from relay.store import keys, lookup, ordering
from relay.store.keys import ChannelKeys
from relay.store.limits import Limit, OrderedAndLimited
from relay.store.ordering import OrderKeyRule, order_key_problem
from tests.helpers.store import (GATE_SHAPES, attempts, bodies, gate_keys, gate_shaped, ids,
                                 now_ms, ordered, publish_ordered, queue, subscribed,
                                 wait_past)


@pytest.fixture(params=list(GATE_SHAPES))
def store(store, request):
    """Each test on a gate of each shape."""
    return gate_shaped(store, request.param)






def take(store, n=100, owner="a", channel="c", timeout_ms=60_000, max_attempts=0):
    [records] = store.deliver("t", channel, [(owner, timeout_ms, n)], max_attempts)
    return records


def finish(store, records, owner="a", channel="c"):
    assert store.finish("t", channel, [(owner, i) for i in ids(records)]) == [1] * len(records)


def test_a_key_goes_out_one_at_a_time_in_publish_order(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("b", b"b1"), ("a", b"a2"), (None, b"u1"), ("a", b"a3"),
                    ("b", b"b2"), (None, b"u2")])
    first = take(store)
    assert bodies(first) == [b"a1", b"b1", b"u1", b"u2"]
    assert take(store) == []
    finish(store, first[:1])
    assert bodies(queue(store, "t", "c")) == [b"a2"]
    second = take(store)
    finish(store, first[1:] + second)
    assert bodies(take(store)) == [b"b2", b"a3"]       # b1 finished first: its key's first
    assert store.reads.read_channel("t", "c")["depth"] == 0


def test_nothing_is_left_of_a_key_once_its_messages_are_finished(store):
    ordered(store)
    publish_ordered(store, [("k%d" % (i % 5), b"%d" % i) for i in range(20)])
    assert store.reads.read_channel("t", "c")["depth"] == 20     # 5 queued, 15 behind their keys
    seen = []
    while records := take(store):
        seen += bodies(records)
        finish(store, records)
    assert seen == [b"%d" % i for i in range(20)]
    assert gate_keys(store) == []


def test_a_requeue_keeps_the_message_first_for_its_key(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("a", b"a2")])
    [a1] = take(store)
    assert store.requeue("t", "c", [("a", ids([a1])[0], 0)]) == [1]
    again = take(store)
    assert bodies(again) == [b"a1"] and attempts(again) == [2]
    assert store.requeue("t", "c", [("a", ids(again)[0], 60_000)]) == [1]
    assert take(store) == []            # deferred, it still holds its key
    assert store.reads.read_channel("t", "c")["deferred_count"] == 1


def test_a_timeout_keeps_the_message_first_for_its_key(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("a", b"a2")])
    take(store, timeout_ms=1)
    wait_past(store, now_ms(store) + 5)
    timed_out, *_ = store.scan("t", "c")
    assert timed_out == 1
    assert bodies(take(store)) == [b"a1"]


def test_a_dead_letter_releases_its_key(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("a", b"a2")])
    [a1] = take(store)
    store.requeue("t", "c", [("a", ids([a1])[0], 0)])
    assert take(store, max_attempts=1) == []    # a1 goes to the outbox, a2 is queued
    assert store.reads.read_channel("t", "c")["dead_count"] == 1
    assert bodies(take(store, max_attempts=1)) == [b"a2"]


def test_expired_messages_release_their_keys(store):
    ordered(store)
    store.expiry.set_ttl("t", "c", 50)
    publish_ordered(store, [("a", b"a1"), ("a", b"a2"), ("b", b"b1")])
    wait_past(store, now_ms(store) + 60)
    for _ in range(2):      # a1 and b1 expire, a2 goes out behind a1, and expires next
        assert take(store) == []
    assert store.reads.read_channel("t", "c")["expired_count"] == 3
    assert gate_keys(store) == []


def test_the_scanners_expiry_releases_keys(store):
    ordered(store)
    store.expiry.set_ttl("t", "c", 50)
    publish_ordered(store, [("a", b"a1"), ("a", b"a2")])
    wait_past(store, now_ms(store) + 60)
    assert store.expiry.expire_parts(["t"]) == 2       # a1 from the head, then a2 released behind it
    assert gate_keys(store) == []


def test_a_deleted_message_releases_its_key_and_a_waiting_one_can_go(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("a", b"a2"), ("a", b"a3")])
    [a1] = queue(store, "t", "c")
    assert lookup.remove(store, "t", "c", "queued", ids([a1])[0], a1)
    [a2] = queue(store, "t", "c")
    assert bodies([a2]) == [b"a2"]
    [a3] = store.ordering.waiting_in("t", "c")
    assert (a3.key, a3.id, a3.position) == (b"a", b"%016x" % (int(ids([a2])[0], 16) + 1), 1)
    assert lookup.remove(store, "t", "c", "waiting", a3.id, a3.element)
    finish(store, take(store))
    assert take(store) == [] and gate_keys(store) == []
    assert store.reads.read_channel("t", "c")["deleted_count"] == 2


def test_an_empty_frees_every_key(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("a", b"a2")])
    take(store)
    store.control.empty_channel("t", "c")
    assert gate_keys(store) == []
    publish_ordered(store, [("a", b"a3")])
    assert bodies(take(store)) == [b"a3"]


def test_other_channels_of_the_topic_are_untouched(store):
    subscribed(store, "t", "plain")
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("a", b"a2"), ("a", b"a3")])
    assert bodies(take(store, channel="plain")) == [b"a1", b"a2", b"a3"]
    assert bodies(take(store)) == [b"a1"]
    assert gate_keys(store, channel="plain") == []


def test_a_deferred_message_holds_its_key_until_delivered_and_finished(store):
    ordered(store)
    publish_ordered(store, [("a", b"later")], defer_ms=50)
    publish_ordered(store, [("a", b"now"), ("b", b"other")])
    assert bodies(take(store)) == [b"other"]
    wait_past(store, now_ms(store) + 60)
    store.scan("t", "c")
    [later] = take(store)
    assert bodies([later]) == [b"later"]
    finish(store, [later])
    assert bodies(take(store)) == [b"now"]


def test_a_deferred_message_behind_its_key_waits_for_its_due_time_too(store):
    ordered(store)
    publish_ordered(store, [("a", b"first")])
    publish_ordered(store, [("a", b"later")], defer_ms=60_000)
    finish(store, take(store))
    assert take(store) == []
    assert store.reads.read_channel("t", "c")["deferred_count"] == 1


def test_turned_off_the_waiting_messages_go_out_in_order(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("a", b"a2"), ("b", b"b1"), ("a", b"a3")])
    assert store.ordering.set_ordered("t", "c", False) == 2
    assert bodies(take(store)) == [b"a1", b"b1", b"a2", b"a3"]
    assert gate_keys(store) == [] and not store.ordering.is_ordered("t", "c")
    publish_ordered(store, [("a", b"a4"), ("a", b"a5")])
    assert bodies(take(store)) == [b"a4", b"a5"]


def test_turned_off_many_waiting_go_out_in_short_calls(store, monkeypatch):
    monkeypatch.setattr(ordering, "RELEASE_STEP", 3)
    ordered(store)
    publish_ordered(store, [("a", b"%d" % i) for i in range(10)])
    assert store.ordering.set_ordered("t", "c", False) == 9
    assert bodies(take(store)) == [b"%d" % i for i in range(10)]
    assert gate_keys(store) == []


def test_ordered_and_a_depth_limit_exclude_each_other(store):
    ordered(store)
    with pytest.raises(OrderedAndLimited, match="t/c is ordered"):
        store.limits.set_limit("t", "c", Limit(10, "reject"))
    subscribed(store, "t", "limited")
    store.limits.set_limit("t", "limited", Limit(10, "reject"))
    with pytest.raises(OrderedAndLimited, match="t/limited has a depth limit"):
        store.ordering.set_ordered("t", "limited", True)
    assert not store.ordering.is_ordered("t", "limited")


def test_turning_on_makes_the_channel(store):
    assert store.ordering.set_ordered("t", "new", True) == 0
    assert store.reads.channel_names("t") == ["new"] and store.ordering.is_ordered("t", "new")
    assert store.reads.read_channel("t", "new")["client_count"] == 0


def test_a_deleted_ordered_channel_is_no_longer_counted(store):
    ordered(store)
    store.control.drop("t", "c", delete=True)
    subscribed(store, "t", "plain")
    publish_ordered(store, [("a", b"1"), ("a", b"2")])
    assert bodies(take(store, channel="plain")) == [b"1", b"2"]
    assert store.redis.hget("relay:{t}:meta", "ordered_channels") == b"0"


def test_a_key_always_goes_to_the_part_its_hash_picks(store):
    store.control.set_partitions("p", 3)
    subscribed(store, "p", "c")
    store.ordering.set_ordered("p", "c", True)
    keys = [b"k%d" % i for i in range(12)]
    for round_ in range(3):
        store.dedup.publish_keyed("p", [b"%d" % round_] * 12, None, 0, keys)
    for part_index, part in enumerate(store.parts("p")):
        gate = store.redis.hgetall(ChannelKeys.of(part, "c").gate)
        assert {zlib.crc32(k) % 3 for k in gate} <= {part_index}
        assert all(int(i[:4], 16) == part_index for i in gate.values())
    assert sum(store.redis.hlen(ChannelKeys.of(p, "c").gate) for p in store.parts("p")) == 12


@pytest.mark.parametrize("rule,body,key", [
    (OrderKeyRule("json-field", "account"), b'{"account": "ac-1", "n": 1}', b"ac-1"),
    (OrderKeyRule("json-field", "account"), b'{"account": 42}', b"42"),
    (OrderKeyRule("json-field", "account"), b'{"account": true}', None),
    (OrderKeyRule("json-field", "account"), b'{"other": 1}', None),
    (OrderKeyRule("json-field", "account"), b'["account"]', None),
    (OrderKeyRule("json-field", "account"), b"not json", None),
    (OrderKeyRule("json-field", "account"), b'{"account": "has space"}', None),
    (OrderKeyRule("separator", ":"), b"device-7:reading 12", b"device-7"),
    (OrderKeyRule("separator", ":"), b"no separator", None),
    (OrderKeyRule("separator", ":"), b":empty key", None),
])
def test_a_rule_reads_the_key_from_the_body(rule, body, key):
    assert rule.key_of(body) == key


def test_a_topic_rule_gives_keys_to_messages_without_one(store):
    store.control.create_topic("t")
    assert store.ordering.order_keys("t", [b"a:1"]) is None
    store.ordering.set_order_rule("t", OrderKeyRule("separator", ":"))
    assert store.ordering.order_rule("t") == OrderKeyRule("separator", ":")
    assert store.ordering.order_keys("t", [b"a:1", b"none", b"b:2"], [None, None, b"given"]) == \
        [b"a", None, b"given"]
    assert store.ordering.order_keys("t", [b"none"]) is None
    store.ordering.set_order_rule("t", None)
    assert store.ordering.order_rule("t") is None


@pytest.mark.parametrize("key,problem", [
    (b"", "KEY_EMPTY"), (b"x" * 257, "KEY_TOO_LONG"), (b"a b", "KEY_NOT_TEXT"),
    (b"\xff", "KEY_NOT_TEXT"), (b"x" * 256, None), ("счёт-1".encode(), None)])
def test_order_key_checks(key, problem):
    assert order_key_problem(key) == problem


def test_a_channel_ordered_under_layout_2_keeps_its_sorted_set_under_layout_3(store):
    """A rolling upgrade's channels: one ordered before `upgrade finish` waits in the
    sorted set it has, one ordered after numbered in msgs; each delivers its keys in
    order."""
    gate_shaped(store, "sorted-set")
    ordered(store, channel="before")
    store.redis.set(keys.LAYOUT, 3)
    ordered(store, channel="after")
    publish_ordered(store, [("a", b"a1"), ("a", b"a2"), ("b", b"b1"), ("a", b"a3")])
    before, after = ChannelKeys.of("t", "before"), ChannelKeys.of("t", "after")
    assert store.redis.zcard(before.waiting) == 2 and gate_keys(store, channel="before") == [
        before.gate.encode(), before.key_of.encode(), before.waiting.encode()]
    assert gate_keys(store, channel="after") == [
        after.gate.encode(), after.key_of.encode(), b"a 1", b"a 2"]
    a1 = store.redis.hget(after.gate, "a").split()[0]
    assert store.redis.hget(after.gate, "a") == a1 + b" 1 3"
    for channel in ("before", "after"):
        seen = []
        while records := take(store, channel=channel):
            seen += bodies(records)
            finish(store, records, channel=channel)
        assert seen == [b"a1", b"b1", b"a2", b"a3"]
        assert gate_keys(store, channel=channel) == []


def test_an_emptied_channel_frees_what_waited_and_numbers_anew(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("a", b"a2"), ("a", b"a3")])
    store.control.empty_channel("t", "c")
    assert gate_keys(store) == []
    assert store.reads.read_channel("t", "c")["depth"] == 0
    publish_ordered(store, [("a", b"a4"), ("a", b"a5")])
    assert store.reads.read_channel("t", "c")["order_waiting"] == 1
    [a4] = take(store)
    finish(store, [a4])
    assert bodies([a4] + take(store)) == [b"a4", b"a5"]


def test_a_deleted_waiting_message_leaves_a_gap_the_release_steps_over(store):
    ordered(store)
    publish_ordered(store, [("a", b"a%d" % i) for i in range(1, 6)])
    waiting = list(store.ordering.waiting_in("t", "c"))
    assert [w.position for w in waiting] == [1, 2, 3, 4]
    for w in waiting[:2] + waiting[3:]:     # a2, a3, a5: a4 is left alone behind a1
        assert lookup.remove(store, "t", "c", "waiting", w.id, w.element)
    assert [(w.position, bodies([w.record])) for w in store.ordering.waiting_in("t", "c")] \
        == [(1, [b"a4"])]
    [a1] = take(store)
    finish(store, [a1])
    [a4] = take(store)
    finish(store, [a4])
    assert bodies([a1, a4]) == [b"a1", b"a4"] and take(store) == []
    assert gate_keys(store) == []
    assert store.reads.read_channel("t", "c")["deleted_count"] == 3
