"""Max attempts and dead letters: deliver.lua's cut, the scanner's forward, redrive."""

import json

import pytest

from relay.store import deadletter
from relay.errors import StoreError
from relay.codec import parse_record
from relay.store import keys
from relay.store.keys import ChannelKeys, TopicKeys
from tests.helpers.api import Api
from tests.helpers.wait import wait_for
from tests.helpers.wire import FRAME_RESPONSE, Wire
from workers.scanner import Scanner

TEMPLATE = "{topic}.dead"


def attempt(store, n=1, max_attempts=2, owner="a"):
    """Deliver up to n messages and REQ them at once: the records delivered."""
    [records] = store.deliver("t", "c", [(owner, 60_000, n)], max_attempts)
    if records:
        store.requeue("t", "c", [(owner, parse_record(r)[2], 0) for r in records])
    return records


def poison(store, body=b"poison"):
    """Publish a message and deliver it past max attempts 1: it is in the outbox."""
    store.publish("t", [body])
    attempt(store, max_attempts=1)
    assert attempt(store, max_attempts=1) == []


def outbox(store):
    return store.redis.lrange(ChannelKeys.of("t", "c").dead, 0, -1)


def dead_messages(store, topic="t.dead"):
    """Letters waiting in a dead-letter topic's backlog."""
    return [json.loads(parse_record(r)[3]) for r in
            store.redis.lrange(TopicKeys.of(topic).backlog, 0, -1)]


@pytest.fixture
def channel(store):
    assert store.subscribe("t", "c", "b1") is True
    return store


def test_the_delivery_after_max_attempts_goes_to_the_outbox(channel):
    store = channel
    store.publish("t", [b"poison", b"fine"])
    assert [parse_record(r)[1] for r in attempt(store, 2)] == [1, 1]
    assert [parse_record(r)[1] for r in attempt(store, 2)] == [2, 2]
    assert attempt(store, 2) == []
    assert [parse_record(r)[1:] for r in outbox(store)] == [
        (2, b"%016x" % 1, b"poison"), (2, b"%016x" % 2, b"fine")]
    state = store.read_channel("t", "c")
    assert (state["depth"], state["in_flight_count"], state["dead_count"]) == (0, 0, 2)
    assert store.redis.zscore(keys.TopicKeys.of("t").due, "c") is not None


def test_a_dead_message_does_not_cost_the_consumer_its_credit(channel):
    store = channel
    store.publish("t", [b"poison"])
    attempt(store, 1, max_attempts=1)
    store.publish("t", [b"next"])
    [records] = store.deliver("t", "c", [("a", 60_000, 1)], 1)
    assert [parse_record(r)[3] for r in records] == [b"next"]
    assert len(outbox(store)) == 1


def test_unlimited_by_default_and_the_channel_setting_wins(channel):
    store = channel
    store.publish("t", [b"m"])
    for _ in range(5):
        assert len(attempt(store, max_attempts=0)) == 1
    store.configure_channel("t", "c", "max_attempts", 3)
    assert attempt(store, max_attempts=0) == []
    assert len(outbox(store)) == 1
    store.publish("t", [b"n"])
    store.configure_channel("t", "c", "max_attempts", 0)
    for _ in range(4):
        assert len(attempt(store, max_attempts=1)) == 1


def test_scanner_publishes_readable_letters_to_the_dead_letter_topic(channel):
    store = channel
    store.publish("t", [b"poison", b"\xff\x00"])
    published_ns = parse_record(store.redis.lindex(ChannelKeys.of("t", "c").queue, 0))[0]
    attempt(store, 2, max_attempts=1)
    assert attempt(store, 2, max_attempts=1) == []
    scanner = Scanner(store, sleep=lambda s: None)
    scanner.scan_once()
    assert scanner.dead == 2
    assert outbox(store) == []
    assert dead_messages(store) == [
        {"topic": "t", "channel": "c", "id": "0000000000000001", "attempts": 1,
         "timestamp": published_ns, "reason": "max_attempts", "body": "poison"},
        {"topic": "t", "channel": "c", "id": "0000000000000002", "attempts": 1,
         "timestamp": published_ns, "reason": "max_attempts", "body_base64": "/wA="}]
    assert store.read_topic("t.dead")["message_count"] == 2
    assert store.read_channel("t", "c")["dead_count"] == 2


def test_a_claimed_outbox_is_left_to_its_scanner(channel):
    store = channel
    poison(store)
    assert deadletter.claim_outbox(store, "t", "c", "other scanner", 10_000, 10) == outbox(store)
    assert deadletter.forward(store, "t", "c", TEMPLATE) == 0
    deadletter.drop_outbox(store, "t", "c", 0)
    assert deadletter.forward(store, "t", "c", TEMPLATE) == 1


def test_the_channel_names_its_own_dead_letter_topic(channel):
    store = channel
    store.configure_channel("t", "c", "dead_letter_topic", "graveyard")
    poison(store)
    assert deadletter.forward(store, "t", "c", TEMPLATE) == 1
    assert [m["body"] for m in dead_messages(store, "graveyard")] == ["poison"]
    store.configure_channel("t", "c", "dead_letter_topic", None)
    assert [letter["body"] for _, _, letter in deadletter.letters(store, "t", "c")] == [
        "poison"]          # found where they went, whatever the setting is now


def test_an_invalid_dead_letter_topic_keeps_the_letters(channel):
    store = channel
    store.configure_channel("t", "c", "dead_letter_topic", "no/slash")
    poison(store)
    with pytest.raises(StoreError, match="'no/slash' of t/c is not a valid topic name"):
        deadletter.forward(store, "t", "c", TEMPLATE)
    assert len(outbox(store)) == 1
    store.configure_channel("t", "c", "dead_letter_topic", None)
    assert deadletter.forward(store, "t", "c", TEMPLATE) == 1


def test_redrive_queues_the_original_message_once_and_empties_the_dead_letter_topic(channel):
    store = channel
    store.publish("t", [b"a", b"b", b"\xfe"])
    published_ns = parse_record(store.redis.lindex(ChannelKeys.of("t", "c").queue, 0))[0]
    attempt(store, 3, max_attempts=1)
    attempt(store, 3, max_attempts=1)
    assert store.subscribe("t.dead", "inspect", "") is True    # two copies of each
    assert store.subscribe("t.dead", "audit", "") is True
    store.subscribe("t", "other", "")
    deadletter.forward(store, "t", "c", TEMPLATE)
    assert len(list(deadletter.letters(store, "t", "c"))) == 6
    steps = [dict(p) for p in deadletter.redrive(store, "t", "c", chunk=4)]
    assert steps == [{"done": 0, "requeued": 0, "total": 6},
                     {"done": 4, "requeued": 3, "total": 6},
                     {"done": 6, "requeued": 3, "total": 6}]
    assert list(deadletter.letters(store, "t", "c")) == []
    assert [store.read_channel("t.dead", ch)["depth"] for ch in ("audit", "inspect")] == [0, 0]
    queue = store.redis.lrange(ChannelKeys.of("t", "c").queue, 0, -1)
    assert [parse_record(r) for r in queue] == [
        (published_ns, 0, b"%016x" % i, body) for i, body in ((1, b"a"), (2, b"b"), (3, b"\xfe"))]
    assert store.read_channel("t", "other")["depth"] == 0
    [records] = store.deliver("t", "c", [("a", 60_000, 3)], 1)
    assert [parse_record(r)[1] for r in records] == [1, 1, 1]


def test_redrive_leaves_other_channels_letters(channel):
    store = channel
    store.subscribe("t", "d", "b1")
    store.publish("t", [b"x"])
    for ch in ("c", "d"):
        for _ in range(2):
            [records] = store.deliver("t", ch, [("a", 60_000, 1)], 1)
            if records:
                store.requeue("t", ch, [("a", parse_record(records[0])[2], 0)])
        deadletter.forward(store, "t", ch, TEMPLATE)
    assert list(deadletter.redrive(store, "t", "c"))[-1]["requeued"] == 1
    assert [(m["channel"], m["body"]) for m in dead_messages(store)] == [("d", "x")]


def test_redrive_to_a_deleted_channel_fails_and_keeps_the_letters(channel):
    store = channel
    poison(store, b"x")
    deadletter.forward(store, "t", "c", TEMPLATE)
    store.delete_channel("t", "c")
    with pytest.raises(StoreError, match="channel t/c does not exist"):
        list(deadletter.redrive(store, "t", "c"))
    assert len(dead_messages(store)) == 1


def test_envelopes_that_are_not_letters_are_ignored():
    for body in (b"", b"[]", b"{}", b'{"reason":"max_attempts"}', b"\xff",
                 b'{"topic":"t","channel":"c","id":"x","attempts":1,"timestamp":1,'
                 b'"reason":"max_attempts","body":"b"}'):
        assert deadletter.read_envelope(body) is None


def test_broker_and_scanner_dead_letter_after_max_attempts(processes):
    _, port = processes.broker("--max-attempts", "2")
    processes.scanner("--queue-scan-interval", "50ms")
    api = Api(port, processes.http_ports[port])
    wire = Wire(port)
    wire.identify()
    assert wire.sub("t", "c", rdy=1) == (FRAME_RESPONSE, b"OK")
    assert api.request("POST", "/pub?topic=t", b"poison")[0] == 200
    for expected in (1, 2):
        _, attempts, msg_id, body = wire.message()
        assert (attempts, body) == (expected, b"poison")
        wire.command(b"REQ " + msg_id + b" 0")
    assert wire.nothing(0.5)
    dead = Wire(port)
    dead.identify()
    assert dead.sub("t.dead", "ops", rdy=1) == (FRAME_RESPONSE, b"OK")
    wait_for(lambda: api.json("GET", "/stats?format=json&topic=t.dead")[1]["topics"],
             timeout=5, interval=0.1)
    letter = json.loads(dead.message()[3])
    assert {k: letter[k] for k in ("topic", "channel", "attempts", "reason", "body")} == {
        "topic": "t", "channel": "c", "attempts": 2, "reason": "max_attempts",
        "body": "poison"}
    _, data = api.json("GET", "/stats?format=json&topic=t")
    assert data["topics"][0]["channels"][0]["dead_count"] == 1
    wire.close()
    dead.close()
