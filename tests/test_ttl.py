"""Message expiry (TTL): deliver.lua's cut with and without a dead-letter topic, requeued
and deferred messages, the topic's TTL and a channel's own, every part of a partitioned
topic (Store tests on fakeredis, one Redis and the cluster); relay-admin ttl, stats and
bad input; and a real broker, scanner and relay-admin subprocess on one Redis and on a
cluster with partitions."""

import json
import time

import pytest

from relay.codec import make_record, parse_record
from relay.store import Store, deadletter
from relay.store.keys import ChannelKeys, TopicKeys
from tests.helpers.admin import ok, ok_json, relay_admin, run
from tests.helpers.api import Api
from tests.helpers.store import bodies, now_ms, parts_of, wait_past
from tests.helpers.wait import wait_for
from tests.helpers.wire import FRAME_RESPONSE, Wire
from tests.test_deadletter import channel, dead_messages, outbox  # noqa: F401  (a fixture)
from workers.scanner import SWEEP_STEP, Scanner

AGE_NS = 7_200_000_000_000      # two hours
TEN_MINUTES = 600_000


def publish_aged(store, *messages, age_ns=AGE_NS, index=None):
    """Publish bodies with a publish time `age_ns` ago."""
    store.run(store.publish_op("t", list(messages), timestamp_ns=time.time_ns() - age_ns,
                               index=index))


def deliver(store, n=10, max_attempts=0, channel="c"):
    [records] = store.deliver("t", channel, [("a", 60_000, n)], max_attempts)
    return records


def meta(store, channel="c", part="t"):
    """The TTL fields of a channel's meta, as redis-cli shows them."""
    values = store.redis.hmget(ChannelKeys.of(part, channel).meta, "ttl_ms", "ttl_from")
    return tuple(v and v.decode() for v in values)


# -- deliver.lua's cut ---------------------------------------------------------------


def test_without_a_ttl_old_messages_are_delivered(channel):
    store = channel
    publish_aged(store, b"old")
    assert bodies(deliver(store)) == [b"old"]
    assert store.reads.read_channel("t", "c")["expired_count"] == 0


def test_an_expired_message_is_dropped_when_the_channel_has_no_dead_letter_topic(channel):
    store = channel
    assert store.expiry.set_ttl("t", "c", TEN_MINUTES) is True
    publish_aged(store, b"old1", b"old2")
    publish_aged(store, b"young", age_ns=60_000_000_000)
    store.publish("t", [b"new"])
    assert bodies(deliver(store)) == [b"young", b"new"]
    c = store.reads.read_channel("t", "c")
    assert (c["depth"], c["in_flight_count"], c["expired_count"], c["dead_count"]) == \
        (0, 2, 2, 0)
    assert outbox(store) == []


def test_the_group_gets_the_next_live_message_in_place_of_an_expired_one(channel):
    store = channel
    store.expiry.set_ttl("t", "c", TEN_MINUTES)
    publish_aged(store, b"old1", b"old2")
    store.publish("t", [b"new1", b"new2", b"new3"])
    assert bodies(deliver(store, 2)) == [b"new1", b"new2"]
    assert store.reads.read_channel("t", "c")["depth"] == 1


def test_an_expired_message_goes_to_the_outbox_tagged_expired_with_max_attempts(channel):
    store = channel
    store.expiry.set_ttl("t", "c", TEN_MINUTES)
    publish_aged(store, b"old")
    assert deliver(store, max_attempts=5) == []
    [entry] = outbox(store)
    assert entry.startswith(b"expired:")
    reason, record = deadletter.split_entry(entry)
    assert (reason, parse_record(record)[1:]) == ("expired", (0, b"0000000000000001", b"old"))
    assert store.scan("t", "c")[3] == 1      # the channel is due: a scanner forwards them
    assert deadletter.forward(store, "t", "c", "{topic}.dead") == 1
    [letter] = dead_messages(store)
    assert {k: letter[k] for k in ("topic", "channel", "id", "attempts", "reason", "body")} \
        == {"topic": "t", "channel": "c", "id": "0000000000000001", "attempts": 0,
            "reason": "expired", "body": "old"}
    c = store.reads.read_channel("t", "c")
    assert (c["expired_count"], c["dead_count"]) == (1, 0)


def test_a_dead_letter_topic_of_the_channel_is_one_too(channel):
    store = channel
    store.control.configure_channel("t", "c", "dead_letter_topic", "t.expired")
    store.expiry.set_ttl("t", "c", TEN_MINUTES)
    publish_aged(store, b"old")
    assert deliver(store) == []
    assert deadletter.forward(store, "t", "c", "{topic}.dead") == 1
    assert store.reads.read_topic("t.expired")["depth"] == 1
    [(_, _, letter)] = list(deadletter.letters(store, "t", "c"))
    assert (letter["reason"], letter["body"]) == ("expired", "old")


def test_redrive_queues_expired_letters_again_with_their_timestamp(channel):
    store = channel
    store.expiry.set_ttl("t", "c", TEN_MINUTES)
    publish_aged(store, b"old")
    deliver(store, max_attempts=3)
    assert deadletter.forward(store, "t", "c", "{topic}.dead") == 1
    [letter] = dead_messages(store)
    assert [p["requeued"] for p in deadletter.redrive(store, "t", "c")] == [0, 1]
    assert deliver(store, max_attempts=3) == []        # older than the TTL still: again
    assert deadletter.forward(store, "t", "c", "{topic}.dead") == 1
    store.expiry.set_ttl("t", "c", None)
    list(deadletter.redrive(store, "t", "c"))
    [record] = deliver(store, max_attempts=3)
    assert parse_record(record) == (letter["timestamp"], 1, b"0000000000000001", b"old")
    assert store.reads.read_channel("t", "c")["expired_count"] == 2


def test_max_attempts_is_checked_before_the_ttl(channel):
    store = channel
    store.expiry.set_ttl("t", "c", 1000)
    store.publish("t", [b"x"])
    [record] = deliver(store, max_attempts=1)
    store.requeue("t", "c", [("a", parse_record(record)[2], 0)])
    wait_past(store, now_ms(store) + 1100)
    assert deliver(store, max_attempts=1) == []
    assert [deadletter.split_entry(e)[0] for e in outbox(store)] == ["max_attempts"]
    c = store.reads.read_channel("t", "c")
    assert (c["expired_count"], c["dead_count"]) == (0, 1)


def test_requeued_and_deferred_messages_are_checked_when_delivered_again(channel):
    store = channel
    store.expiry.set_ttl("t", "c", 300)
    store.publish("t", [b"requeued"])
    [record] = deliver(store)
    store.requeue("t", "c", [("a", parse_record(record)[2], 0)])
    store.publish("t", [b"deferred"], defer_ms=400)
    wait_past(store, now_ms(store) + 450)
    assert store.scan("t", "c")[:2] == (0, 1)          # promoted
    assert deliver(store) == []
    c = store.reads.read_channel("t", "c")
    assert (c["depth"], c["deferred_count"], c["expired_count"]) == (0, 0, 2)


# -- the topic's TTL and a channel's own ---------------------------------------------


def test_the_topic_ttl_governs_its_channels_later_ones_too_and_a_channel_own_wins(channel):
    store = channel
    store.expiry.set_ttl("t", None, TEN_MINUTES)
    store.subscribe("t", "d", "b1")
    assert (meta(store), meta(store, "d")) == (("600000", "topic"), ("600000", "topic"))
    assert store.redis.hget(TopicKeys.of("t").meta, "ttl_ms") == b"600000"
    store.expiry.set_ttl("t", "c", 3_600_000)
    store.expiry.set_ttl("t", None, 300_000)
    assert (meta(store), meta(store, "d")) == (("3600000", "channel"), ("300000", "topic"))
    store.expiry.set_ttl("t", "d", 0)             # none on d, whatever the topic's
    publish_aged(store, b"old")
    assert (bodies(deliver(store)), bodies(deliver(store, channel="d"))) == ([], [b"old"])
    store.expiry.set_ttl("t", "c", None)          # c takes the topic's again
    assert meta(store) == ("300000", "topic")
    store.expiry.set_ttl("t", None, None)
    assert (meta(store), meta(store, "d")) == ((None, None), ("0", "channel"))
    assert store.expiry.ttl_settings("t") == {"ttl_ms": None, "channels": {
        "c": {"ttl_ms": None, "source": None}, "d": {"ttl_ms": 0, "source": "channel"}}}
    assert store.expiry.set_ttl("t", "nope", 1000) is False


def test_a_deleted_channel_made_again_takes_the_topic_ttl(channel):
    store = channel
    store.expiry.set_ttl("t", "c", 1000)
    store.control.delete_channel("t", "c")
    store.subscribe("t", "c", "b1")
    assert meta(store) == (None, None)
    store.expiry.set_ttl("t", None, 2000)
    store.control.delete_channel("t", "c")
    store.subscribe("t", "c", "b1")
    assert meta(store) == ("2000", "topic")


def test_every_part_of_a_partitioned_topic_expires_and_counts(store):
    store.control.set_partitions("t", 3)
    store.subscribe("t", "c", "b1")
    store.expiry.set_ttl("t", None, TEN_MINUTES)
    store.expiry.set_ttl("t", "c", 1_200_000)
    store.control.set_partitions("t", 4)          # a new part takes the topic's and the channel's
    store.subscribe("t", "d", "b1")
    for part in store.parts("t"):
        assert store.redis.hget(TopicKeys.of(part).meta, "ttl_ms") == b"600000"
        assert (meta(store, "c", part), meta(store, "d", part)) == \
            (("1200000", "channel"), ("600000", "topic"))
    for index in range(4):
        publish_aged(store, b"old", index=index)
        store.run(store.publish_op("t", [b"new"], index=index))
    got = store.deliver("t", "c", [("a", 60_000, 8)], 0)[0]
    assert sorted(bodies(got)) == [b"new"] * 4
    assert parts_of(store, field="expired_count") == [1, 1, 1, 1]
    assert store.reads.read_channel("t", "c")["expired_count"] == 4
    assert store.reads.read_channel("t", "d")["expired_count"] == 0


# -- the scanner's sweep (expire.lua) --------------------------------------------------


def test_the_sweep_takes_expired_messages_out_of_a_queue_nobody_consumes(channel):
    store = channel
    store.expiry.set_ttl("t", "c", TEN_MINUTES)
    publish_aged(store, b"old1", b"old2")
    store.publish("t", [b"new"])
    assert store.expiry.expire_parts(["t"]) == 2
    c = store.reads.read_channel("t", "c")
    assert (c["depth"], c["expired_count"], c["dead_count"]) == (1, 2, 0)
    assert outbox(store) == []
    assert bodies(deliver(store)) == [b"new"]


def test_the_sweep_dead_letters_them_where_a_delivery_would(channel):
    store = channel
    store.subscribe("t", "d", "b1")
    store.subscribe("t", "e", "b1")
    store.control.configure_channel("t", "d", "dead_letter_topic", "t.expired")
    store.control.configure_channel("t", "e", "max_attempts", 0)     # its own: none
    store.expiry.set_ttl("t", None, TEN_MINUTES)
    publish_aged(store, b"old")
    assert store.expiry.expire_parts(["t"], max_attempts=3) == 3
    [entry] = outbox(store)
    assert deadletter.split_entry(entry)[0] == "expired"
    assert store.scan("t", "c")[3] == 1      # the channel is due: a scanner forwards it
    assert store.redis.llen(ChannelKeys.of("t", "d").dead) == 1
    assert store.redis.llen(ChannelKeys.of("t", "e").dead) == 0
    for name in "cde":
        c = store.reads.read_channel("t", name)
        assert (name, c["depth"], c["expired_count"]) == (name, 0, 1)


def test_the_sweep_stops_at_its_bound_and_at_the_first_live_message(channel):
    store = channel
    store.expiry.set_ttl("t", "c", TEN_MINUTES)
    publish_aged(store, *[b"old%d" % i for i in range(5)])
    store.publish("t", [b"new"])
    publish_aged(store, b"behind")           # as a requeued message, behind a live one
    assert store.run(store.expiry.expire_op("t", most=3)) == (3, True)
    assert store.run(store.expiry.expire_op("t", most=3)) == (2, False)
    assert store.run(store.expiry.expire_op("t", most=3)) == (0, False)
    assert store.reads.read_channel("t", "c")["depth"] == 2
    assert bodies(deliver(store)) == [b"new"]          # the one behind, at delivery
    assert store.reads.read_channel("t", "c")["expired_count"] == 6


def test_the_sweep_looks_only_where_the_topic_meta_says_a_ttl_is_in_force(store):
    """A channel TTL written straight into a channel meta, without ttl.lua's flag in its
    topic meta, is not swept (the sweep reads the flags, not every channel)."""
    for topic in ("a", "b"):
        store.subscribe(topic, "c", "b1")
        store.run(store.publish_op(topic, [b"old"], timestamp_ns=time.time_ns() - AGE_NS))
    store.redis.hset(ChannelKeys.of("a", "c").meta, "ttl_ms", TEN_MINUTES)
    store.expiry.set_ttl("b", "c", TEN_MINUTES)
    assert store.redis.hget(TopicKeys.of("b").meta, "channel_ttl") == b"1"
    assert store.expiry.expire_parts(["a", "b"]) == 1
    assert (store.reads.read_channel("a", "c")["depth"], store.reads.read_channel("b", "c")["depth"]) \
        == (1, 0)
    store.expiry.set_ttl("b", "c", None)
    assert store.redis.hget(TopicKeys.of("b").meta, "channel_ttl") is None


def test_the_sweep_bound_spans_channels_and_reads(channel):
    """`most` counts over every channel of a call; a channel it does not reach makes
    the call say more, and queues longer than one read (100) are read again."""
    store = channel
    store.subscribe("t", "d", "b1")
    store.expiry.set_ttl("t", None, TEN_MINUTES)
    publish_aged(store, *[b"old%d" % i for i in range(250)])
    first = store.run(store.expiry.expire_op("t", most=260))
    assert first == (260, True)             # 250 of one channel, 10 of the other
    assert store.run(store.expiry.expire_op("t", most=260)) == (240, False)
    assert [store.reads.read_channel("t", name)["expired_count"] for name in "cd"] == [250, 250]


def test_the_sweep_sends_a_spent_message_as_a_max_attempts_letter(channel):
    """An expired message already delivered max-attempts times goes as deliver.lua
    sends it: a plain outbox entry, counted in dead_count."""
    store = channel
    publish_aged(store, b"tried")
    [record] = deliver(store)
    store.requeue("t", "c", [("a", parse_record(record)[2], 0)])   # attempts 1, queued
    store.expiry.set_ttl("t", "c", TEN_MINUTES)
    assert store.expiry.expire_parts(["t"], max_attempts=1) == 1
    assert [deadletter.split_entry(e)[0] for e in outbox(store)] == ["max_attempts"]
    c = store.reads.read_channel("t", "c")
    assert (c["depth"], c["dead_count"], c["expired_count"]) == (0, 1, 0)


def test_the_sweep_leaves_a_paused_channel_alone(channel):
    store = channel
    store.expiry.set_ttl("t", "c", TEN_MINUTES)
    publish_aged(store, b"old")
    store.control.pause_channel("t", "c", True)
    assert store.expiry.expire_parts(["t"]) == 0
    assert store.reads.read_channel("t", "c")["depth"] == 1
    store.control.pause_channel("t", "c", False)
    assert store.expiry.expire_parts(["t"]) == 1


def test_the_sweep_takes_every_part_and_a_new_part_knows_a_channel_ttl(store):
    store.control.set_partitions("t", 3)
    store.subscribe("t", "c", "b1")
    store.expiry.set_ttl("t", "c", TEN_MINUTES)
    for index in range(3):
        publish_aged(store, b"old", index=index)
    assert store.expiry.expire_parts(store.parts("t")) == 3
    assert parts_of(store) == [0, 0, 0]
    assert parts_of(store, field="expired_count") == [1, 1, 1]
    store.control.set_partitions("t", 4)
    assert store.redis.hget(TopicKeys.of(store.parts("t")[3]).meta, "channel_ttl") == b"1"
    publish_aged(store, b"old", index=3)
    assert store.expiry.expire_parts(store.parts("t")) == 1


def test_the_scanner_sweeps_and_forwards_them_with_the_brokers_max_attempts(channel):
    store = channel
    store.expiry.set_ttl("t", "c", TEN_MINUTES)
    publish_aged(store, b"old")
    clock = [0.0]
    scanner = Scanner(Store(store.redis), clock=lambda: clock[0], max_attempts=3)
    scanner.scan_once()                   # the node due indexes seeded
    clock[0] += SWEEP_STEP
    scanner.scan_once()                   # the sweep's slice: the channel due now
    time.sleep(0.05)                      # the scanner's clock is a little behind Redis'
    scanner.scan_once()                   # the letter forwarded
    assert [(m["reason"], m["body"]) for m in dead_messages(store)] == [("expired", "old")]
    c = store.reads.read_channel("t", "c")
    assert (c["depth"], c["expired_count"]) == (0, 1)


# -- the outbox's entries -------------------------------------------------------------


def test_split_entry_reads_plain_and_tagged_entries():
    record = make_record(1_795_000_000_000_000_000, 3, b"0000000000000001", b"a:b")
    assert deadletter.split_entry(record) == ("max_attempts", record)
    assert deadletter.split_entry(b"expired:" + record) == ("expired", record)
    assert deadletter.split_entry(b"overflow:" + record) == ("overflow", record)


def test_envelopes_carry_each_known_reason():
    record = make_record(5, 0, b"0000000000000001", b"x")
    for reason in deadletter.REASONS:
        letter = deadletter.read_envelope(deadletter.envelope("t", "c", record, reason))
        assert letter is not None and letter["reason"] == reason
    assert deadletter.read_envelope(deadletter.envelope("t", "c", record, "bored")) is None


def test_msg_finds_an_expired_message_in_the_outbox(channel, backend):
    store = channel
    store.expiry.set_ttl("t", "c", TEN_MINUTES)
    publish_aged(store, b"old")
    deliver(store, max_attempts=3)
    assert ok(backend, "msg", "t", "0000000000000001")[1:] == [
        "channel  state        attempts  position  due  broker  client",
        "c        dead letter  0         1         -    -       -"]
    assert ok_json(backend, "msg", "t", "0000000000000001")["channels"][0]["reason"] == \
        "expired"


# -- relay-admin ttl and stats -------------------------------------------------------


def test_ttl_shows_and_sets_the_topic_and_channel_settings(channel, backend):
    store = channel
    store.subscribe("t", "d", "b1")
    assert ok(backend, "ttl", "t") == ["t: ttl off", "channel  ttl  set on",
                                       "c        off  -", "d        off  -"]
    assert ok(backend, "ttl", "t", "10m") == ["t: ttl 10m", "channel  ttl  set on",
                                              "c        10m  topic", "d        10m  topic"]
    assert ok(backend, "ttl", "t", "c", "1h") == ["t: ttl 10m", "channel  ttl  set on",
                                                  "c        1h   channel"]
    assert ok_json(backend, "ttl", "t/d", "0") == {
        "topic": "t", "ttl_ms": 600000,
        "channels": [{"channel": "d", "ttl_ms": 0, "source": "channel"}]}
    assert ok(backend, "ttl", "t", "d", "--off")[1:] == ["channel  ttl  set on",
                                                        "d        10m  topic"]
    assert ok(backend, "ttl", "t", "--off") == ["t: ttl off", "channel  ttl  set on",
                                                "c        1h   channel", "d        off  -"]
    assert ok(backend, "ttl", "t", "c", "1500ms")[2] == "c        1500ms  channel"
    assert meta(store) == ("1500", "channel")


def test_ttl_of_a_topic_without_channels(store, backend):
    store.control.create_topic("t")
    assert ok(backend, "ttl", "t", "30s") == ["t: ttl 30s; no channels"]
    store.control.create_channel("t", "c")
    assert ok(backend, "ttl", "t", "c") == ["t: ttl 30s", "channel  ttl  set on",
                                            "c        30s  topic"]


def test_stats_count_expired_messages(channel, backend):
    store = channel
    store.expiry.set_ttl("t", "c", TEN_MINUTES)
    publish_aged(store, b"a", b"b")
    deliver(store)
    assert ok(backend, "stats", "t")[:3] == [
        "topic  channel  depth  in_flight  deferred  messages  requeued  timed_out  dead  "
        "deleted  expired  overflowed  clients  paused",
        "t               0                 0         2                                   "
        "                                        no",
        "       c        0      0          0         2         0         0          0     "
        "0        2        0           0        no"]
    [c] = ok_json(backend, "stats", "t/c")["topics"][0]["channels"]
    assert (c["expired_count"], c["dead_count"]) == (2, 0)


@pytest.mark.parametrize("args, code, message", [
    (("nope", "10m"), 1, "topic 'nope' not found"),
    (("t", "nope", "10m"), 1, "channel t/nope not found"),
    (("t/nope", "--off"), 1, "channel t/nope not found"),
    (("t", "c", "ten"), 2, "Invalid value for 'TTL': not a duration: 'ten' (use e.g. 250ms, "
                           "60s, 15m, 1h) (see relay-admin ttl --help)"),
    (("t", "10x"), 2, "Invalid value for 'TTL': not a duration: '10x' (use e.g. 250ms, 60s, "
                      "15m, 1h) (see relay-admin ttl --help)"),
    (("t", "c", "--", "-5000"), 2, "Invalid value for 'TTL': a TTL is not negative: '-5000' "
                                   "(see relay-admin ttl --help)"),
    (("t", "c", "-5m"), 2, "No such option '-5' (see relay-admin ttl --help)"),
    (("t", "c", "10m", "--off"), 2, "give a TTL or --off, not both (see relay-admin ttl "
                                    "--help)"),
    (("t/c", "10m", "1h"), 2, "unexpected extra argument '1h' (see relay-admin ttl --help)"),
    (("t/c/d", "10m"), 1, "invalid name 'c/d': 1-64 characters of [.a-zA-Z0-9_-], "
                          "optionally ending in #ephemeral"),
])
def test_ttl_refuses_bad_input_and_changes_nothing(channel, backend, args, code, message):
    store = channel
    store.expiry.set_ttl("t", None, TEN_MINUTES)
    before = store.expiry.ttl_settings("t")
    result = run(backend, "ttl", *args)
    assert (result.exit_code, result.stdout, result.stderr) == (
        code, "", f"relay-admin: {message}\n")
    assert store.expiry.ttl_settings("t") == before


# -- a real broker, scanner and relay-admin -------------------------------------------


@pytest.mark.integration
@pytest.mark.cluster
def test_broker_does_not_deliver_an_expired_message_and_dead_letters_it(processes,
                                                                        redis_url):
    _, port = processes.broker("--topic-partitions", "2")
    processes.scanner("--queue-scan-interval", "50ms")
    api = Api(port, processes.http_ports[port])
    for args in (("create", "t"), ("create", "t/c"),
                 ("config", "t/c", "dead-letter-topic", "t.expired"), ("ttl", "t", "1s")):
        done = relay_admin(redis_url, *args)
        assert done.returncode == 0, done.stderr
    assert relay_admin(redis_url, "ttl", "t", "c").stdout == (
        "t: ttl 1s\nchannel  ttl  set on\nc        1s   topic\n")
    for body in (b"old1", b"old2"):
        assert api.request("POST", "/pub?topic=t", body)[:2] == (200, b"OK")
    time.sleep(1.2)
    assert api.request("POST", "/pub?topic=t", b"fresh")[:2] == (200, b"OK")
    wire = Wire(port)
    wire.identify()
    assert wire.sub("t", "c", rdy=10) == (FRAME_RESPONSE, b"OK")
    _, attempts, _, body = wire.message()
    assert (attempts, body) == (1, b"fresh")
    assert wire.nothing(0.5)
    dead = Wire(port)
    dead.identify()
    assert dead.sub("t.expired", "ops", rdy=10) == (FRAME_RESPONSE, b"OK")
    letters = sorted((json.loads(dead.message()[3]) for _ in range(2)),
                     key=lambda l: l["body"])
    assert [{k: l[k] for k in ("topic", "channel", "attempts", "reason", "body")}
            for l in letters] == [
        {"topic": "t", "channel": "c", "attempts": 0, "reason": "expired", "body": "old1"},
        {"topic": "t", "channel": "c", "attempts": 0, "reason": "expired", "body": "old2"}]
    stats = json.loads(relay_admin(redis_url, "stats", "t/c", "--json").stdout)
    assert stats["topics"][0]["channels"][0]["expired_count"] == 2
    _, data = api.json("GET", "/stats?format=json&topic=t&channel=c")
    assert data["topics"][0]["channels"][0]["expired_count"] == 2
    metrics = api.request("GET", "/metrics")[1].decode().splitlines()
    assert 'relay_channel_expired_total{channel="c",topic="t"} 2.0' in metrics
    wire.close()
    dead.close()


@pytest.mark.integration
@pytest.mark.cluster
def test_a_scanner_takes_expired_messages_nobody_consumes_out(processes, redis_url):
    """`relay scanner --max-attempts` as the brokers have it: the expired messages of a
    channel without consumers leave its depth and arrive in the dead-letter topic."""
    _, port = processes.broker("--topic-partitions", "2", "--max-attempts", "3")
    processes.scanner("--queue-scan-interval", "50ms", "--max-attempts", "3")
    api = Api(port, processes.http_ports[port])
    for args in (("create", "t"), ("create", "t/c"), ("ttl", "t", "1s")):
        done = relay_admin(redis_url, *args)
        assert done.returncode == 0, done.stderr
    for body in (b"old1", b"old2", b"old3"):
        assert api.request("POST", "/pub?topic=t", body)[:2] == (200, b"OK")

    def channel_stats():
        stats = json.loads(relay_admin(redis_url, "stats", "t/c", "--json").stdout)
        c = stats["topics"][0]["channels"][0]
        return c["depth"], c["expired_count"]
    assert wait_for(lambda: channel_stats() == (0, 3), 20, 0.5), channel_stats()
    dead = Wire(port)
    dead.identify()
    assert dead.sub("t.dead", "ops", rdy=10) == (FRAME_RESPONSE, b"OK")
    letters = sorted(json.loads(dead.message()[3])["body"] for _ in range(3))
    assert letters == ["old1", "old2", "old3"]
    dead.close()
