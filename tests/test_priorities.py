"""Message priorities (issue 60 part 2, data layout 5, relay/store/priorities.py): every
channel of a topic delivers the higher priorities first and FIFO within one, and a
message keeps its priority wherever it goes. Store tests run on fakeredis, one Redis
and the cluster; the last ones run a real broker and its consumers."""

import json

import pytest

from relay.codec import FRAME_RESPONSE, record_id
from relay.codec import make_record, parse_record
from relay.store import codes, deadletter
from relay.store.keys import ChannelKeys, TopicKeys, id_part, id_priority
from relay.store.limits import Limit
from relay.store.lookup import queued, remove, where
from relay.store.connection import connect
from relay.store.priorities import PrioritiesRefused, parse_priority, priority_of
from tests.helpers.admin import run
from tests.helpers.api import Api
from tests.helpers.store import bodies, empty_channel, now_ms, ordered, subscribed, wait_past
from tests.helpers.wait import wait_for
from tests.helpers.wire import Wire


def publish(store, pairs, topic="t", defer_ms=0):
    """Publish (body, priority) pairs in one call."""
    store.dedup.publish_keyed(topic, [b for b, _ in pairs], None, defer_ms, None,
                              [p for _, p in pairs])


def store_record(message: bytes) -> bytes:
    """The stored record of a delivered message (what a dead letter's envelope keeps)."""
    ts, attempts, msg_id, body = parse_record(message)
    return make_record(ts, attempts, msg_id, body)


def counted(store, topic="t", channel="c") -> dict:
    """The urgent counts of a channel, checked against its lists' lengths."""
    c = ChannelKeys.of(topic, channel)
    counts = {int(p): int(n) for p, n in store.redis.hgetall(c.urgent).items()}
    lengths = {p: store.redis.llen(c.urgent_list(p)) for p in range(1, 10)}
    assert counts == {p: n for p, n in lengths.items() if n}
    return counts


def take(store, count=100, topic="t", channel="c", owner="a"):
    return store.deliver(topic, channel, [(owner, 60_000, count)])[0]


def one_by_one(store, n, topic="t", channel="c"):
    """Bodies delivered one per call, as a consumer at RDY 1 that finishes each."""
    out = []
    for _ in range(n):
        [record] = take(store, 1, topic, channel)
        store.finish(topic, channel, [("a", record_id(record))])
        out += bodies([record])
    return out


# bodies that sort against their publish order, so that only publish order gives FIFO
# bodies that sort against their publish order: only publish order gives FIFO
MIXED = [(b"z0", 0), (b"y5", 5), (b"x9", 9), (b"w0", 0), (b"v5", 5), (b"u1", 1), (b"t9", 9)]
BY_PRIORITY = [b"x9", b"t9", b"y5", b"v5", b"u1", b"z0", b"w0"]


def test_higher_priorities_go_first_and_each_in_publish_order(store):
    subscribed(store)
    publish(store, MIXED)
    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=7, message_count=7, client_count=1)
    assert counted(store) == {9: 2, 5: 2, 1: 1}
    assert one_by_one(store, 7) == BY_PRIORITY
    publish(store, MIXED)
    assert bodies(take(store, 3)) == BY_PRIORITY[:3]
    assert counted(store) == {5: 1, 1: 1}
    assert store.reads.read_channel("t", "c")["depth"] == 4
    assert bodies(take(store, 10)) == BY_PRIORITY[3:]
    assert counted(store) == {}


def test_an_id_carries_its_priority_and_still_names_its_part(store):
    store.control.set_partitions("t", 3)
    subscribed(store)
    for _ in range(6):
        publish(store, [(b"x", 7)])
    records = [r for part in store.parts("t")
               for r in store.redis.lrange(ChannelKeys.of(part, "c").urgent_list(7), 0, -1)]
    assert len(records) == 6
    assert {id_priority(record_id(r)) for r in records} == {7}
    assert sorted({id_part(record_id(r)) for r in records}) == [0, 1, 2]
    got = take(store, 10)
    assert len(got) == 6
    assert store.finish("t", "c", [("a", record_id(r)) for r in got]) == [codes.DONE] * 6


def test_a_topic_without_priorities_stores_its_messages_as_before(store):
    subscribed(store)
    store.publish("t", [b"1", b"2"])
    publish(store, [(b"3", 0)])
    c = ChannelKeys.of("t", "c")
    assert store.redis.exists(c.urgent) == 0
    assert store.redis.hget(c.meta, "urgent") is None
    assert [record_id(r)[:4] for r in store.redis.lrange(c.queue, 0, -1)] == [b"0000"] * 3


def test_a_requeued_or_timed_out_message_goes_back_at_its_own_priority(store):
    subscribed(store)
    publish(store, [(b"low", 0), (b"high", 8)])
    [high] = take(store, 1)
    assert store.requeue("t", "c", [("a", record_id(high), 0)]) == [codes.DONE]
    publish(store, [(b"later high", 8)])
    assert bodies(take(store, 2)) == [b"high", b"later high"]
    store.deliver("t", "c", [("b", 50, 1)])        # `low`, timing out
    wait_past(store, now_ms(store) + 60)
    store.scan("t", "c")
    publish(store, [(b"mid", 4)])
    got = take(store, 5)
    assert bodies(got) == [b"mid", b"low"]
    assert [record_id(r)[0:1] for r in got] == [b"4", b"0"]


def test_a_dead_brokers_messages_and_a_lot_go_back_at_their_priorities(store):
    subscribed(store, broker="dead")
    publish(store, [(b"low", 0), (b"high-a", 6), (b"high-b", 6)])
    got = store.run(store.deliver_op("t", "c", [("dead:1", 60_000, 3)], lots=True))
    assert got.lotted
    assert store.run(store.reap_op("t", "c", "dead")) == (0, 3)
    publish(store, [(b"later", 6)])
    assert bodies(take(store, 10)) == [b"high-a", b"high-b", b"later", b"low"]


def test_a_deferred_message_enters_its_priority_when_due(store):
    subscribed(store)
    publish(store, [(b"due later", 6)], defer_ms=50)
    publish(store, [(b"plain", 0)])
    wait_past(store, now_ms(store) + 60)
    assert store.scan("t", "c")[1] == 1
    assert bodies(take(store, 5)) == [b"due later", b"plain"]


def test_the_backlog_keeps_priorities_for_the_first_channel(store):
    publish(store, MIXED)
    store.publish("t", [b"h0"])
    subscribed(store)
    assert store.reads.read_channel("t", "c")["depth"] == 8
    assert bodies(take(store, 20)) == [*BY_PRIORITY[:5], b"z0", b"w0", b"h0"]
    assert store.redis.hget(TopicKeys.of("t").meta, "urgent_backlog") is None


def test_a_first_channel_takes_a_big_backlog_with_priorities_in_steps(store):
    """Over 10,000 records to sort into lists go over in steps (subscribe.lua), not in
    the SUB's call; a SUB meanwhile learns that steps are under way."""
    for start in range(0, 10_200, 1_000):
        publish(store, [(b"%05d" % i, 5 if i % 1000 == 999 else 0)
                        for i in range(start, min(start + 1_000, 10_200))])
    t = TopicKeys.of("t")
    [joined] = store.run_many([store.subscribe_op("t", "c", "b1")])
    assert (joined.created, joined.hand_over) == (True, True)
    assert store.redis.hget(t.meta, "paused") == b"unpausing"
    assert store.reads.read_channel("t", "c")["depth"] == 0
    [again] = store.run_many([store.subscribe_op("t", "c", "b2")])
    assert (again.created, again.hand_over) == (False, True)
    publish(store, [(b"late", 0)])
    store.hand_over("t")
    assert store.redis.hget(t.meta, "paused") is None
    assert store.redis.hget(t.meta, "urgent_backlog") is None
    assert store.reads.read_channel("t", "c")["depth"] == 10_201
    got = bodies(take(store, 10_201))
    assert got[:10] == [b"%05d" % i for i in range(999, 10_200, 1000)]
    assert got[10:] == [b"%05d" % i for i in range(10_200) if i % 1000 != 999] + [b"late"]


def test_a_paused_topics_backlog_keeps_priorities(store):
    subscribed(store)
    store.control.pause_topic("t", True)
    publish(store, MIXED)
    store.control.pause_topic("t", False)
    assert bodies(take(store, 20)) == BY_PRIORITY


def test_an_ordered_channel_keeps_each_keys_publish_order_whatever_the_priorities(store):
    ordered(store)
    store.ordering.set_order_rule("t", None)
    bodies_ = [b"k1-a", b"k1-b", b"k2-a"]
    store.dedup.publish_keyed("t", bodies_, None, 0, [b"k1", b"k1", b"k2"], [0, 9, 1])
    first = take(store, 10)
    assert bodies(first) == [b"k2-a", b"k1-a"]      # one per key; k2's priority 1 first
    publish(store, [(b"plain", 0)])
    store.finish("t", "c", [("a", record_id(first[1]))])     # k1-a: releases k1-b (9)
    assert bodies(take(store, 10)) == [b"k1-b", b"plain"]


def test_ttl_sweeps_urgent_messages_too(store):
    subscribed(store)
    store.expiry.set_ttl("t", "c", 50)
    publish(store, [(b"old", 3), (b"old plain", 0)])
    wait_past(store, now_ms(store) + 60)
    publish(store, [(b"new", 3)])
    assert store.expiry.expire_parts(["t"]) == 2
    assert bodies(take(store, 5)) == [b"new"]
    assert counted(store) == {}


def test_a_depth_limit_counts_urgent_messages_and_drops_priority_0_first(store):
    subscribed(store)
    store.limits.set_limit("t", "c", Limit(3, "drop-oldest"))
    publish(store, [(b"p0-a", 0), (b"p5", 5), (b"p0-b", 0), (b"p1", 1), (b"p9", 9)])
    assert store.reads.read_channel("t", "c")["depth"] == 3
    assert counted(store) == {9: 1, 5: 1, 1: 1}
    publish(store, [(b"p2", 2)])
    assert counted(store) == {9: 1, 5: 1, 2: 1}
    assert bodies(take(store, 10)) == [b"p9", b"p5", b"p2"]


def test_empty_drops_urgent_messages(store):
    subscribed(store)
    publish(store, MIXED)
    store.control.empty_channel("t", "c")
    assert store.reads.read_channel("t", "c")["depth"] == 0
    assert store.redis.hget(ChannelKeys.of("t", "c").meta, "urgent") is None
    assert take(store, 10) == []


def test_msg_peek_and_delete_see_the_priority(store):
    subscribed(store)
    publish(store, MIXED)
    assert [(m["body"], m["priority"], m["position"]) for m in queued(store, "t", "c", 3)] == [
        (b"x9", 9, 1), (b"t9", 9, 2), (b"y5", 5, 3)]
    ids = {m["body"]: m["id"].encode() for m in queued(store, "t", "c", 10)}
    found = where(store, "t", "c", ids[b"v5"])
    assert (found["state"], found["position"], found["priority"]) == ("queued", 4, 5)
    assert where(store, "t", "c", ids[b"w0"])["position"] == 7
    assert remove(store, "t", "c", "queued", ids[b"v5"], found["record"]) is True
    assert counted(store) == {9: 2, 5: 1, 1: 1}
    assert bodies(take(store, 10)) == [b"x9", b"t9", b"y5", b"u1", b"z0", b"w0"]


def test_replay_and_redrive_keep_each_messages_priority(store):
    store.history.set_retention("t", 3_600_000, 0)
    subscribed(store)
    publish(store, MIXED)
    take(store, 10)
    store.control.empty_channel("t", "c")
    result = run(store.redis, "replay", "t", "c", "--since", "1h")
    assert result.stdout == "replayed 7 messages to t/c (0 skipped: in flight or deferred)\n"
    got = take(store, 10)
    assert bodies(got) == BY_PRIORITY
    store.finish("t", "c", [("a", record_id(r)) for r in got])
    assert store.redis.exists(ChannelKeys.of("t", "c").urgent) == 0
    publish(store, [(b"plain", 0)])
    letters = [deadletter.envelope("t", "c", store_record(r)) for r in got[:2]]
    assert [deadletter.read_envelope(b)["id"][:1] for b in letters] == ["9", "9"]
    assert store.run(deadletter.redrive_op("t", "c", [store_record(r) for r in got[:2]],
                                           store.node("t"))) == 2
    assert bodies(take(store, 10)) == [b"x9", b"t9", b"plain"]


def test_stats_shows_the_depth_by_priority(store):
    subscribed(store)
    subscribed(store, channel="plain")
    store.unsubscribe_op  # noqa: B018 (both channels get every message)
    publish(store, MIXED)
    take(store, 2, channel="plain")
    data = json.loads(run(store.redis, "stats", "t", "--json").stdout)
    by = {c["channel_name"]: c["depth_by_priority"] for c in data["topics"][0]["channels"]}
    assert by == {"c": {"9": 2, "5": 2, "1": 1, "0": 2}, "plain": {"5": 2, "1": 1, "0": 2}}
    lines = run(store.redis, "stats", "t").stdout.splitlines()
    assert lines[0].split()[-1] == "by_priority"
    assert [line.split("  ")[-1].strip() for line in lines[2:4]] == [
        "9:2 5:2 1:1 0:2", "5:2 1:1 0:2"]


def test_relay_admin_pub_and_the_topic_rule_give_priorities(store):
    subscribed(store)
    assert run(store.redis, "pub", "t", "--priority", "7", input="a\nb\n").stdout == \
        "published 2 messages to t\n"
    assert run(store.redis, "priority", "t", "--json-field", "p").stdout == \
        "t: priority rule json-field 'p'\n"
    assert run(store.redis, "pub", "t", input='{"p": 3}\nplain\n').exit_code == 0
    got = take(store, 10)
    assert [(b, int(record_id(r)[:1])) for r, b in zip(got, bodies(got))] == [
        (b"a", 7), (b"b", 7), (b'{"p": 3}', 3), (b"plain", 0)]
    assert json.loads(run(store.redis, "priority", "t", "--off", "--json").stdout) == {
        "topic": "t", "priority_rule": None}
    assert run(store.redis, "priority", "t", "--json-field", "p", "--off").exit_code == 2


def test_priorities_and_rules_parse(store):
    assert [parse_priority(t) for t in "09"] == [0, 9]
    for bad in ("", "10", "-1", "a", " 1"):
        with pytest.raises(ValueError):
            parse_priority(bad)
    assert [priority_of(json.dumps(b).encode(), "p") for b in (
        {"p": 3}, {"p": 12}, {"p": -2}, {"p": 2.0}, {"p": 2.5}, {"p": "3"}, {"p": True}, {},
        [1])] == [3, 9, 0, 2, 0, 0, 0, 0, 0]
    assert priority_of(b"not json", "p") == 0


def test_below_layout_5_priorities_are_refused(store):
    store.redis.set("relay:layout", 4)
    with pytest.raises(PrioritiesRefused):
        store.priorities.set_rule("t", "p")
    result = run(store.redis, "priority", "t", "--json-field", "p")
    assert result.exit_code == 1
    assert "message priorities need data layout 5 in force" in result.output


# -- a real broker ---------------------------------------------------------------

@pytest.mark.integration
def test_a_stock_consumer_at_rdy_1_gets_the_highest_priority_waiting(processes, redis_url):
    """/mpub?priority= and a topic's rule for TCP PUB (set before the broker first reads
    the topic), with a raw consumer at RDY 1 that finishes each: it never gets a message
    while one of a higher priority waits, and each priority's come in publish order."""
    admin = run(connect(redis_url), "priority", "t", "--json-field", "p")
    assert admin.output == "t: priority rule json-field 'p'\n"
    _, port = processes.broker()
    api = Api(port, processes.http_ports[port])
    assert api.request("POST", "/channel/create?topic=t&channel=c")[0] == 200
    assert api.request("POST", "/pub?topic=t&priority=10", b"x")[:2] == (
        400, b'{"message":"INVALID_PRIORITY"}')
    sent = []
    for priority in (3, 0, 9, 1, 9, 5, 0, 7):
        batch = [b"%d-%d" % (priority, len(sent) + n) for n in range(5)]
        assert api.request("POST", f"/mpub?topic=t&priority={priority}",
                           b"\n".join(batch))[0] == 200
        sent += [(priority, b) for b in batch]
    wire = Wire(port)
    for priority in (8, 2):
        body = json.dumps({"p": priority}).encode()
        assert wire.pub("t", body) == (FRAME_RESPONSE, b"OK")
        sent.append((priority, body))
    consumer = Wire(port)
    consumer.identify()
    assert consumer.sub("t", "c", rdy=1) == (FRAME_RESPONSE, b"OK")
    got = []
    for _ in sent:
        message = consumer.message()
        got.append((int(message[2][:1]), message[3]))
        consumer.command(b"FIN " + message[2])
    assert consumer.nothing()
    assert got == sorted(sent, key=lambda s: -s[0])
    consumer.close()
    wire.close()


@pytest.mark.integration
def test_a_sub_to_a_topic_with_a_big_backlog_with_priorities_gets_it_all_by_steps(
        processes, redis_url):
    """The first channel's backlog of 11,000, too big to sort into lists in the SUB's
    call: the broker runs the steps (subscribe.lua, Broker._hand_over) and the consumer
    gets every message. The first step's 10,000 come urgent ones first; the second
    step's urgent one may come after priority 0 ones of the first (the consumer starts
    on each step as it lands)."""
    _, port = processes.broker()
    api = Api(port, processes.http_ports[port])
    for start in range(0, 11_000, 1_000):
        assert api.request("POST", "/mpub?topic=t", b"\n".join(
            b"%05d" % i for i in range(start, start + 999)))[0] == 200
        assert api.request("POST", "/mpub?topic=t&priority=5", b"%05d" % (start + 999))[0] == 200
    consumer = Wire(port)
    consumer.identify()
    assert consumer.sub("t", "c", rdy=2500) == (FRAME_RESPONSE, b"OK")
    got = consumer.finish_next(11_000)
    assert consumer.nothing()
    assert got[:10] == [b"%05d" % i for i in range(999, 10_000, 1000)]
    assert [m for m in got[10:] if m != b"10999"] == [
        b"%05d" % i for i in range(11_000) if i % 1000 != 999]
    assert b"10999" in got[10:]
    assert connect(redis_url).hget(TopicKeys.of("t").meta, "paused") is None
    consumer.close()


@pytest.mark.integration
def test_a_broker_refuses_priorities_until_layout_5_is_in_force(processes, redis_url):
    """Under layout 4 (a rolling upgrade from 0.5.0 not finished) a priority above 0 is
    refused and nothing is published; priority=0 is a plain publish."""
    connect(redis_url).set("relay:layout", 4)
    _, port = processes.broker()
    api = Api(port, processes.http_ports[port])
    assert api.request("POST", "/pub?topic=t&priority=3", b"x")[:2] == (
        400, b'{"message":"PRIORITIES_NEED_UPGRADE"}')
    assert api.request("POST", "/mpub?topic=t&priority=0", b"x\ny")[:2] == (200, b"OK")
    assert connect(redis_url).llen(TopicKeys.of("t").backlog) == 2
    assert run(connect(redis_url), "pub", "t", "--priority", "3", input="z\n").exit_code == 1
