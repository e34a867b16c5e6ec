"""What the operations on a channel do to an ordered one (relay/store/ordering.py,
lib/order.lua), at the Store on fakeredis, a real server and a cluster: pause (channel
and topic), empty, replay (workers/operations.py, replay.lua handing back, redrive.lua),
redrive of dead letters, relay-admin requeue, and a Spark query's micro-batches
(relay/spark/batches.py). After each: no key stuck, no message lost, never two of one
key out at once."""

import pytest

from relay import codec
from relay.spark.batches import QueryBatches
from relay.store import deadletter
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.ordering import OrderKeyRule
from tests.helpers.admin import ok, run
from tests.helpers.store import (GATE_SHAPES, attempts, bodies, channel_state, gate_keys,
                                 gate_shaped, ids, now_ms, publish_ordered, queue, subscribed,
                                 wait_past, waiting_bodies)
from tests.helpers.store import ordered as ordered_channel
from workers import operations
from workers.operations import replay_end

SEPARATOR = OrderKeyRule("separator", ":")


@pytest.fixture(params=list(GATE_SHAPES))
def store(store, request):
    """Each test on a gate of each shape."""
    return gate_shaped(store, request.param)


def ordered(store, topic="t", channel="c", retention=False):
    if retention:
        store.control.create_topic(topic)
        store.history.set_retention(topic, 3_600_000, 0)
    return ordered_channel(store, topic, channel)




def take(store, n=100, owner="a", channel="c", timeout_ms=60_000, max_attempts=0, topic="t"):
    [records] = store.deliver(topic, channel, [(owner, timeout_ms, n)], max_attempts)
    return records


def finish(store, records, owner="a", channel="c", topic="t"):
    assert store.finish(topic, channel, [(owner, i) for i in ids(records)]) == [1] * len(records)


def gate(store, topic="t", channel="c"):
    """({order key: id of its message out}, {order key: bodies waiting behind it, in
    their order}), checking that key_of agrees with the gate."""
    c = ChannelKeys.of(topic, channel)
    out = {}
    for key, value in store.redis.hgetall(c.gate).items():
        msg_id = value.split()[0]       # then the seqs of those waiting, if numbered
        assert store.redis.hget(c.key_of, msg_id) == key
        out[key.decode()] = msg_id.decode()
    return out, waiting_bodies(store, topic, channel)


def no_gate(store, topic="t", channel="c"):
    return gate_keys(store, topic, channel) == []


def drain(store, **kw):
    """Take and finish until nothing comes: the bodies, a list per take."""
    rounds = []
    while records := take(store, **kw):
        rounds.append(bodies(records))
        finish(store, records, **{k: v for k, v in kw.items() if k in ("owner", "channel")})
    return rounds


def by_rule(store, messages, topic="t"):
    """Publish with the keys of the topic's rule, as a broker does."""
    store.dedup.publish_keyed(topic, messages, None, 0, store.ordering.order_keys(topic, messages))


def replay_all(store, topic="t", channel="c"):
    plan = store.history.plan_replay(topic)
    return operations.run(store, "replay", topic, channel, params=plan.params)


# -- pause ---------------------------------------------------------------------------

def test_a_paused_channel_moves_nothing_and_keeps_order_when_unpaused(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("b", b"b1"), ("a", b"a2"), ("a", b"a3")])
    first = take(store)
    assert bodies(first) == [b"a1", b"b1"]
    store.control.pause_channel("t", "c", True)
    publish_ordered(store, [("a", b"a4"), ("b", b"b2"), ("c", b"c1")])
    assert take(store) == []
    finish(store, first[:1])                    # a1 done while paused: a2 is queued
    [b1] = first[1:]
    assert store.requeue("t", "c", [("a", ids([b1])[0], 0)]) == [1]     # b1 stays first
    assert take(store) == []
    assert bodies(queue(store, "t", "c")) == [b"c1", b"a2", b"b1"]
    assert gate(store)[1] == {"a": [b"a3", b"a4"], "b": [b"b2"]}
    store.control.pause_channel("t", "c", False)
    assert drain(store) == [[b"c1", b"a2", b"b1"], [b"a3", b"b2"], [b"a4"]]
    assert no_gate(store)


def test_a_paused_topic_hands_its_backlog_over_without_order_keys(store):
    """The backlog keeps records only: what is published while the topic is paused
    reaches an ordered channel unkeyed, so it goes out at once, beside its key's
    message out."""
    ordered(store)
    publish_ordered(store, [("a", b"a1")])
    store.control.pause_topic("t", True)
    assert store.ordering.ordered_channels("t") == 1
    publish_ordered(store, [("a", b"a2"), ("a", b"a3")])
    assert store.redis.llen(TopicKeys.of("t").backlog) == 2
    [a1] = take(store)
    assert bodies([a1]) == [b"a1"]
    store.control.pause_topic("t", False)
    records = take(store)
    assert bodies(records) == [b"a2", b"a3"]
    assert gate(store) == ({"a": ids([a1])[0].decode()}, {})
    finish(store, records)
    assert gate(store) == ({"a": ids([a1])[0].decode()}, {})
    finish(store, [a1])
    assert no_gate(store)


def test_relay_admin_says_a_paused_topic_keeps_no_order_keys(store, backend):
    ordered(store)
    subscribed(store, "plain", "c")
    paused = run(backend, "pause", "t")
    assert paused.exit_code == 0 and paused.stdout == "paused t\n"
    assert paused.stderr == (
        "relay-admin: t has ordered channels: what is published while it is paused reaches "
        "them without order keys (a topic's backlog keeps none); pausing a channel keeps "
        "them\n")
    assert run(backend, "pause", "plain").stderr == ""
    assert run(backend, "pause", "t/c").stderr == ""
    assert ok(backend, "unpause", "t") == ["unpaused t"]


# -- empty ---------------------------------------------------------------------------

def test_an_empty_frees_every_key_and_what_was_out_cannot_free_a_new_one(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("a", b"a2"), ("b", b"b1")])
    publish_ordered(store, [("c", b"c1")], defer_ms=60_000)
    held = take(store)
    assert bodies(held) == [b"a1", b"b1"]
    result = operations.run(store, "empty", "t", "c")
    assert result["messages"] == 4     # 2 in flight, 1 deferred, 1 waiting
    assert result["done"] == result["total"]
    assert no_gate(store)
    publish_ordered(store, [("a", b"a3"), ("a", b"a4")])
    assert store.finish("t", "c", [("a", i) for i in ids(held)]) == [0, 0]
    assert store.requeue("t", "c", [("a", ids(held)[0], 0)]) == [0]
    assert drain(store) == [[b"a3"], [b"a4"]]
    assert store.reads.read_channel("t", "c")["deferred_count"] == 0
    assert no_gate(store)


# -- replay --------------------------------------------------------------------------

def replay_setup(store, rule=None):
    """a1 finished, a2 in flight, a3 waiting; b1 finished, b2 out (queued); u1 (no key)
    finished. Returns a2's record."""
    ordered(store, retention=True)
    if rule:
        store.ordering.set_order_rule("t", rule)
        by_rule(store, [b"a:1", b"b:1", b"u1", b"a:2", b"a:3", b"b:2"])
    else:
        publish_ordered(store, [("a", b"a:1"), ("b", b"b:1"), (None, b"u1"), ("a", b"a:2"),
                        ("a", b"a:3"), ("b", b"b:2")])
    first = take(store)
    assert bodies(first) == [b"a:1", b"b:1", b"u1"]
    finish(store, first)
    assert bodies(queue(store, "t", "c")) == [b"a:2", b"b:2"]
    [a2] = take(store, n=1)
    assert bodies([a2]) == [b"a:2"]
    return a2


def test_a_replay_without_a_rule_queues_unkeyed_and_skips_what_the_channel_holds(store):
    a2 = replay_setup(store)
    [b2] = queue(store, "t", "c")
    result = replay_all(store)
    assert (result["replayed"], result["skipped"], result["total"]) == (3, 3, 6)
    # a:2 in flight, a:3 waiting and b:2 out were skipped; the rest go out at once
    assert bodies(queue(store, "t", "c")) == [b"b:2", b"a:1", b"b:1", b"u1"]
    assert gate(store) == ({"a": ids([a2])[0].decode(), "b": ids([b2])[0].decode()},
                           {"a": [b"a:3"]})
    replayed = take(store)
    assert bodies(replayed) == [b"b:2", b"a:1", b"b:1", b"u1"]
    assert attempts(replayed) == [1, 1, 1, 1]      # attempts start over
    finish(store, replayed)                     # a replayed copy frees no key
    assert take(store) == [] and list(gate(store)[0]) == ["a"]
    finish(store, [a2])
    assert drain(store) == [[b"a:3"]]
    assert no_gate(store)
    assert store.reads.read_channel("t", "c")["message_count"] == 6 + 3


def test_a_replay_with_a_rule_passes_the_gate_in_publish_order(store):
    a2 = replay_setup(store, SEPARATOR)
    result = replay_all(store)
    assert (result["replayed"], result["skipped"]) == (3, 3)
    # u1 has no key: queued; a:1 and b:1 wait behind a:2 (in flight) and b:2 (queued),
    # a:1 before a:3, in id order
    assert bodies(queue(store, "t", "c")) == [b"b:2", b"u1"]
    assert gate(store)[1] == {"a": [b"a:1", b"a:3"], "b": [b"b:1"]}
    assert store.reads.read_channel("t", "c")["depth"] == 5
    b2_u1 = take(store)
    assert bodies(b2_u1) == [b"b:2", b"u1"]
    finish(store, [a2])
    [a1] = take(store)
    assert bodies([a1]) == [b"a:1"] and take(store) == []       # b:2 is still out
    finish(store, b2_u1)
    assert bodies(take(store)) == [b"b:1"]
    finish(store, [a1])
    assert bodies(take(store)) == [b"a:3"]


def test_a_replay_with_a_rule_delivers_each_key_in_order_to_the_end(store):
    a2 = replay_setup(store, SEPARATOR)
    replay_all(store)
    finish(store, [a2])
    assert drain(store) == [[b"b:2", b"u1", b"a:1"], [b"b:1", b"a:3"]]
    assert no_gate(store)
    assert store.reads.read_channel("t", "c")["message_count"] == 6 + 3


def test_a_replayed_key_of_another_part_is_unkeyed(store):
    """On a partitioned topic a message published with key d (part 0) whose body's rule
    key is a (part 1) is replayed in part 0 without a key: a key's gate is in its part."""
    store.control.set_partitions("t", 2)
    ordered(store, retention=True)
    publish_ordered(store, [("d", b"a:1")])
    store.ordering.set_order_rule("t", SEPARATOR)
    by_rule(store, [b"a:2"])
    records = take(store)
    assert sorted(bodies(records)) == [b"a:1", b"a:2"]
    finish(store, [r for r in records if bodies([r]) == [b"a:1"]])
    result = replay_all(store)
    assert (result["replayed"], result["skipped"]) == (1, 1)     # a:2 is in flight
    part0 = store.part("t", 0)
    assert bodies(take(store)) == [b"a:1"]
    assert gate(store, part0) == ({}, {})
    assert list(gate(store, store.part("t", 1))[0]) == ["a"]


def test_a_replay_ends_at_the_newest_entry_at_its_start():
    assert replay_end(None, "+") == "+"
    assert replay_end("100-5", "+") == "100-5"
    assert replay_end("100-5", "200") == "100-5"
    assert replay_end("100-5", "100") == "100-5"
    assert replay_end("300-5", "200") == "200"


def test_an_unordered_channel_replays_as_before(store):
    store.control.create_topic("t")
    store.history.set_retention("t", 3_600_000, 0)
    subscribed(store, "t", "c")
    store.ordering.set_order_rule("t", SEPARATOR)
    publish_ordered(store, [("a", b"a:1"), ("a", b"a:2")])
    [a1, a2] = take(store)
    finish(store, [a1])
    result = replay_all(store)
    assert (result["replayed"], result["skipped"]) == (1, 1)
    assert bodies(take(store)) == [b"a:1"]
    assert no_gate(store)


# -- redrive -------------------------------------------------------------------------

def dead_letter_a1(store, rule=None):
    """a1 reached max attempts and went to the dead-letter topic; a2, out after it, is in
    flight. Returns a2's record."""
    ordered(store)
    if rule:
        store.ordering.set_order_rule("t", rule)
    publish_ordered(store, [("a", b"a:1"), ("a", b"a:2"), ("b", b"b:1")])
    first = take(store)
    assert bodies(first) == [b"a:1", b"b:1"]
    finish(store, first[1:])
    store.requeue("t", "c", [("a", ids(first)[0], 0)])
    assert take(store, max_attempts=1) == []    # a:1 is dead, a:2 goes out
    [a2] = take(store, max_attempts=1)
    assert bodies([a2]) == [b"a:2"]
    assert deadletter.forward(store, "t", "c", "{topic}.dead") == 1
    assert [letter["body"] for _, _, letter in deadletter.letters(store, "t", "c")] == [
        "a:1"]
    return a2


def test_a_redriven_letter_without_a_rule_goes_out_unkeyed(store):
    a2 = dead_letter_a1(store)
    result = operations.run(store, "redrive", "t", "c")
    assert result["requeued"] == 1
    [a1] = take(store)
    assert bodies([a1]) == [b"a:1"] and attempts([a1]) == [1]    # attempts start over
    assert gate(store) == ({"a": ids([a2])[0].decode()}, {})
    finish(store, [a1])
    assert gate(store)[0] == {"a": ids([a2])[0].decode()}     # a1's FIN frees nothing
    finish(store, [a2])
    assert no_gate(store) and take(store) == []


def test_a_redriven_letter_with_a_rule_waits_behind_its_key(store):
    a2 = dead_letter_a1(store, SEPARATOR)
    assert operations.run(store, "redrive", "t", "c")["requeued"] == 1
    assert take(store) == []
    assert gate(store)[1] == {"a": [b"a:1"]}
    assert list(deadletter.letters(store, "t", "c")) == []
    finish(store, [a2])
    assert drain(store) == [[b"a:1"]]
    assert no_gate(store)


def test_a_letter_whose_message_the_channel_holds_again_is_not_queued_twice(store):
    """A letter whose id is in flight on the ordered channel again (queued meanwhile,
    here by a redrive call of its own) is skipped, so that one id is never out twice:
    a FIN of one copy would free the key of the other."""
    a2 = dead_letter_a1(store)
    [(_, _, letter)] = deadletter.letters(store, "t", "c")
    record = codec.make_record(letter["timestamp"], 0, letter["id"].encode(),
                                          letter["body_bytes"])
    assert store.run(deadletter.redrive_op("t", "c", [record], store.node("t"))) == 1
    [copy] = take(store)
    assert store.run(deadletter.redrive_op("t", "c", [record], store.node("t"))) == 0
    timestamp, _, a2_id, a2_body = codec.parse_record(a2)     # as delivered: stored again
    assert store.run(deadletter.redrive_op("t", "c", [codec.make_record(
        timestamp, 0, a2_id, a2_body)], store.node("t"))) == 0      # a:2: in flight
    assert operations.run(store, "redrive", "t", "c")["requeued"] == 1     # handled
    assert list(deadletter.letters(store, "t", "c")) == []
    assert queue(store, "t", "c") == [] and take(store) == []
    finish(store, [copy, a2])
    assert no_gate(store)


# -- relay-admin requeue -------------------------------------------------------------

def test_an_admin_requeue_keeps_the_message_first_for_its_key(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("a", b"a2"), ("b", b"b1")])
    held = take(store, owner="x")
    assert bodies(held) == [b"a1", b"b1"]
    assert store.control.requeue_in_flight("t", "c", ids(held)[:1]) == [1]
    assert store.finish("t", "c", [("x", ids(held)[0])]) == [0]     # its holder lost it
    again = take(store)
    assert bodies(again) == [b"a1"] and attempts(again) == [2]
    assert gate(store)[1] == {"a": [b"a2"]}
    finish(store, again)
    assert bodies(take(store)) == [b"a2"]


def test_relay_admin_requeue_replay_and_redrive_on_an_ordered_channel(store, backend):
    a2 = dead_letter_a1(store, SEPARATOR)
    assert ok(backend, "requeue", "t/c", ids([a2])[0].decode()) == [
        "id                result", f"{ids([a2])[0].decode()}  requeued"]
    assert ok(backend, "redrive", "t/c") == ["redrove 1 dead letters to t/c"]
    assert gate(store) == ({"a": ids([a2])[0].decode()}, {"a": [b"a:1"]})
    assert drain(store) == [[b"a:2"], [b"a:1"]]
    assert no_gate(store)


def test_an_admin_requeue_of_all_keeps_each_message_first_for_its_key(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("b", b"b1"), ("a", b"a2"), ("b", b"b2")])
    held = take(store, owner="x")
    result = operations.run(store, "requeue", "t", "c")
    assert (result["requeued"], result["total"]) == (2, 2)
    again = take(store)
    assert sorted(bodies(again)) == [b"a1", b"b1"]
    assert sorted(ids(again)) == sorted(ids(held))
    finish(store, again)
    assert sorted(bodies(take(store))) == [b"a2", b"b2"]


# -- a Spark query's micro-batches ---------------------------------------------------

def test_a_spark_query_claims_one_message_per_key_per_batch_in_order(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("b", b"b1"), ("a", b"a2"), (None, b"u1"), ("a", b"a3"),
                    ("b", b"b2"), (None, b"u2")])
    query = QueryBatches(store, "t", "c", "q")
    assert query.claim(10) == 4
    batch1 = query.records(1)
    assert bodies(batch1) == [b"a1", b"b1", b"u1", b"u2"]
    assert query.claim(10) == 0                 # a and b are out in batch 1
    assert query.progress() == {"claimed": 1, "finished": 0, "parked": 0}
    # the query is killed -9 (nothing parked, nothing confirmed) and runs again from its
    # checkpoint, within the lease: it reads batch 1 again, the same records
    again = QueryBatches(store, "t", "c", "q")
    assert again.records(1) == batch1
    assert again.confirm(1)["finished"] == 1
    assert again.claim(10) == 2
    assert bodies(again.records(2)) == [b"a2", b"b2"]
    assert again.claim(10) == 0
    again.confirm(2)
    assert again.claim(10) == 1
    assert bodies(again.records(3)) == [b"a3"]
    again.confirm(3)
    assert again.claim(10) == 0
    assert channel_state(store, "c", "t") == (0, 0, 0)
    assert no_gate(store)


def test_a_spark_claim_that_ran_out_stays_first_for_its_key(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("a", b"a2")])
    query = QueryBatches(store, "t", "c", "q", lease_ms=20)
    assert query.claim(10) == 1
    wait_past(store, now_ms(store) + 30)        # the driver died: nothing renewed
    assert store.scan("t", "c")[0] == 1         # a1 back in the queue, still first for a
    assert bodies(queue(store, "t", "c")) == [b"a1"]
    assert query.confirm(1)["finished"] == 1    # the restarted run confirms batch 1
    assert query.claim(10) == 1                 # a1's copy is finished, not a batch
    assert bodies(query.records(2)) == [b"a2"]
    query.confirm(2)
    assert channel_state(store, "c", "t") == (0, 0, 1)
    assert no_gate(store)
