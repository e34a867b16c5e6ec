"""Max attempts and dead letters: deliver.lua's cut, the scanner's forward, redrive, in
each part of a partitioned topic; relay-admin's config, dlq and redrive; and a real
broker and scanner. Store tests run on fakeredis, one Redis and the cluster."""

import json

import pytest

from relay.admin import steering
from relay.codec import parse_record
from relay.errors import StoreError
from relay.store import deadletter
from relay.store import keys
from relay.store.keys import ChannelKeys, TopicKeys
from tests.helpers.admin import ok, ok_json, run
from tests.helpers.api import Api
from tests.helpers.jobs import work
from tests.helpers.store import channel_state, now_ms, parts_of, wait_past
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
    state = store.reads.read_channel("t", "c")
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
    store.control.configure_channel("t", "c", "max_attempts", 3)
    assert attempt(store, max_attempts=0) == []
    assert len(outbox(store)) == 1
    store.publish("t", [b"n"])
    store.control.configure_channel("t", "c", "max_attempts", 0)
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
    assert store.reads.read_topic("t.dead")["message_count"] == 2
    assert store.reads.read_channel("t", "c")["dead_count"] == 2


def test_a_claimed_outbox_is_left_to_its_scanner(channel):
    store = channel
    poison(store)
    assert deadletter.claim_outbox(store, "t", "c", "other scanner", 10_000, 10) == outbox(store)
    assert deadletter.forward(store, "t", "c", TEMPLATE) == 0
    deadletter.drop_outbox(store, "t", "c", 0)
    assert deadletter.forward(store, "t", "c", TEMPLATE) == 1


def test_the_channel_names_its_own_dead_letter_topic(channel):
    store = channel
    store.control.configure_channel("t", "c", "dead_letter_topic", "graveyard")
    poison(store)
    assert deadletter.forward(store, "t", "c", TEMPLATE) == 1
    assert [m["body"] for m in dead_messages(store, "graveyard")] == ["poison"]
    store.control.configure_channel("t", "c", "dead_letter_topic", None)
    assert [letter["body"] for _, _, letter in deadletter.letters(store, "t", "c")] == [
        "poison"]          # found where they went, whatever the setting is now


def test_an_invalid_dead_letter_topic_keeps_the_letters(channel):
    store = channel
    store.control.configure_channel("t", "c", "dead_letter_topic", "no/slash")
    poison(store)
    with pytest.raises(StoreError, match="'no/slash' of t/c is not a valid topic name"):
        deadletter.forward(store, "t", "c", TEMPLATE)
    assert len(outbox(store)) == 1
    store.control.configure_channel("t", "c", "dead_letter_topic", None)
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
    assert [store.reads.read_channel("t.dead", ch)["depth"] for ch in ("audit", "inspect")] == [0, 0]
    queue = store.redis.lrange(ChannelKeys.of("t", "c").queue, 0, -1)
    assert [parse_record(r) for r in queue] == [
        (published_ns, 0, b"%016x" % i, body) for i, body in ((1, b"a"), (2, b"b"), (3, b"\xfe"))]
    assert store.reads.read_channel("t", "other")["depth"] == 0
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
    store.control.delete_channel("t", "c")
    with pytest.raises(StoreError, match="channel t/c does not exist"):
        list(deadletter.redrive(store, "t", "c"))
    assert len(dead_messages(store)) == 1


def test_envelopes_that_are_not_letters_are_ignored():
    for body in (b"", b"[]", b"{}", b'{"reason":"max_attempts"}', b"\xff",
                 b'{"topic":"t","channel":"c","id":"x","attempts":1,"timestamp":1,'
                 b'"reason":"max_attempts","body":"b"}'):
        assert deadletter.read_envelope(body) is None


# -- a partitioned topic: every part ---------------------------------------------


def dead_in_every_part(store) -> None:
    """Three messages, one per part of t, delivered on t/c at max attempts 1 and timed
    out twice: each goes to t.dead (read by channel `read`)."""
    store.control.set_partitions("t", 3)
    store.subscribe("t", "c", "b1")
    store.subscribe("t.dead", "read", "")
    for n in range(3):
        store.publish("t", [b"%d" % n])
    scanner = Scanner(store)
    for attempt in range(2):
        got = store.deliver("t", "c", [("o", 50, 3)], max_attempts=1)[0]
        assert len(got) == (3 if attempt == 0 else 0)
        wait_past(store, now_ms(store) + 60)
        scanner.scan_once()


def test_timeouts_and_dead_letters_of_every_part(store):
    dead_in_every_part(store)
    assert store.reads.read_channel("t", "c")["timeout_count"] == 3
    assert store.reads.read_channel("t", "c")["dead_count"] == 3
    letters = [json.loads(parse_record(r)[3])
               for r in store.deliver("t.dead", "read", [("r", 60_000, 10)])[0]]
    assert sorted((l["topic"], l["channel"], l["body"]) for l in letters) == \
        [("t", "c", "0"), ("t", "c", "1"), ("t", "c", "2")]


def test_redrive_puts_each_letter_back_in_its_part(store):
    dead_in_every_part(store)
    assert channel_state(store, "c", "t") == (0, 0, 3)
    list(deadletter.redrive(store, "t", "c"))
    assert parts_of(store) == [1, 1, 1]
    [got] = store.deliver("t", "c", [("o", 60_000, 3)])
    assert store.finish("t", "c", [("o", parse_record(r)[2]) for r in got]) == [1, 1, 1]


# -- relay-admin config, dlq and redrive -------------------------------------------


def dead_letters(store, *bodies, max_attempts=1):
    """Publish bodies on t/c and deliver them past max_attempts; a scanner forwards them."""
    store.subscribe("t", "c", "b1")
    store.publish("t", list(bodies))
    for _ in range(max_attempts + 1):
        [records] = store.deliver("t", "c", [("a", 60_000, len(bodies))], max_attempts)
        if records:
            store.requeue("t", "c", [("a", parse_record(r)[2], 0) for r in records])
    assert deadletter.forward(store, "t", "c", deadletter.DEFAULT_TEMPLATE) == len(bodies)


def test_config_shows_the_value_in_force_and_where_it_comes_from(store, backend, monkeypatch,
                                                                  tmp_path):
    monkeypatch.chdir(tmp_path)     # no conf/relay.toml, no RELAY_ variable
    for name in ("RELAY_CONFIG", "RELAY_MAX_ATTEMPTS", "RELAY_DEAD_LETTER_TOPIC"):
        monkeypatch.delenv(name, raising=False)
    store.subscribe("t", "c", "b1")
    assert ok(backend, "config", "t/c") == ["setting            value   source",
                                            "max-attempts       0       default",
                                            "dead-letter-topic  t.dead  default"]
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "relay.toml").write_text('dead_letter_topic = "{topic}-dlq"\n')
    monkeypatch.setenv("RELAY_MAX_ATTEMPTS", "3")
    assert ok_json(backend, "config", "t/c") == {
        "max-attempts": {"value": 3, "source": "RELAY_MAX_ATTEMPTS"},
        "dead-letter-topic": {"value": "t-dlq", "source": "conf/relay.toml"}}
    (tmp_path / "other.toml").write_text("max_attempts = 4\n")
    monkeypatch.delenv("RELAY_MAX_ATTEMPTS")
    assert ok(backend, "--config", "other.toml", "config", "t/c")[1:] == [
        "max-attempts       4       other.toml", "dead-letter-topic  t.dead  default"]

    ok(backend, "config", "t/c", "max-attempts", "5")
    ok(backend, "config", "t/c", "dead-letter-topic", "poison")
    assert ok(backend, "config", "t/c") == ["setting            value   source",
                                            "max-attempts       5       channel setting",
                                            "dead-letter-topic  poison  channel setting"]
    assert store.reads.channel_setting("t", "c", "max_attempts") == "5"
    assert ok_json(backend, "config", "t/c", "max-attempts", "--unset") == {
        "max-attempts": {"value": 0, "source": "default"},
        "dead-letter-topic": {"value": "poison", "source": "channel setting"}}
    monkeypatch.setenv("RELAY_MAX_ATTEMPTS", "many")
    result = run(backend, "config", "t/c")
    assert (result.exit_code, result.stderr) == (
        1, "relay-admin: invalid max_attempts: Not a valid integer.\n")


def test_config_refuses_bad_values_and_targets(store, backend):
    store.subscribe("t", "c", "b1")
    for args, message in [
        (("t/c", "max-attempts", "x"), "max-attempts must be a whole number 0-65535, not 'x'"),
        (("t/c", "max-attempts", "70000"),
         "max-attempts must be a whole number 0-65535, not '70000'"),
        (("t/c", "dead-letter-topic", "a/b"), "invalid topic name 'a/b'"),
        (("t/c", "max-attempts"), "give a value for max-attempts, or --unset"),
        (("t/nope",), "channel t/nope not found"),
    ]:
        result = run(backend, "config", *args)
        assert (result.exit_code, result.stderr) == (1, f"relay-admin: {message}\n"), args


def test_dlq_lists_readable_letters(store, backend):
    dead_letters(store, b"first", b"line\nbreak", b"\xff")
    lines = ok(backend, "dlq", "t/c")
    assert lines[0].split() == ["id", "attempts", "published", "reason", "body"]
    rows = [line.split(maxsplit=4) for line in lines[1:]]
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [
        ("0000000000000001", "1", "max_attempts", "first"),
        ("0000000000000002", "1", "max_attempts", "line\\nbreak"),
        ("0000000000000003", "1", "max_attempts", "/w==")]
    letters = ok_json(backend, "dlq", "t/c", "-n", "2")
    assert [(x["id"], x["body"]) for x in letters] == [("0000000000000001", "first"),
                                                        ("0000000000000002", "line\nbreak")]
    store.subscribe("t", "empty", "b1")
    assert ok(backend, "dlq", "t/empty") == ["no dead letters for t/empty"]


def test_redrive_inline_and_as_a_job(store, backend, monkeypatch):
    dead_letters(store, b"a", b"b")
    assert ok(backend, "redrive", "t/c") == ["redrove 2 dead letters to t/c"]
    queue = ChannelKeys.of("t", "c").queue
    assert [parse_record(r)[1:] for r in store.redis.lrange(queue, 0, -1)] == [
        (0, b"0000000000000001", b"a"), (0, b"0000000000000002", b"b")]
    assert ok(backend, "dlq", "t/c") == ["no dead letters for t/c"]

    store.redis.delete(queue)
    dead_letters(store, b"c")
    monkeypatch.setattr(steering, "INLINE_LIMIT", 0)
    queued = ok_json(backend, "redrive", "t/c", "--background")
    assert (queued["status"], queued["operation"], queued["target"]) == (
        "queued", "redrive", "t/c")
    work(backend)
    [job] = ok_json(backend, "jobs")["jobs"]
    assert (job["state"], job["done"], job["total"]) == ("finished", 1, 1)
    assert [parse_record(r)[3] for r in store.redis.lrange(queue, 0, -1)] == [b"c"]


def test_stats_count_dead_letters(store, backend):
    dead_letters(store, b"x")
    [topic] = [t for t in ok_json(backend, "stats")["topics"] if t["topic_name"] == "t"]
    assert topic["channels"][0]["dead_count"] == 1
    assert json.loads(run(backend, "stats", "t/c", "--json").stdout)["topics"][0][
        "channels"][0]["dead_count"] == 1


# -- a real broker and scanner ------------------------------------------------------


@pytest.mark.integration
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
