"""Bounded channels (issue 38 item 4, relay-admin limit): a channel's depth limit with
reject, drop-oldest or dead-letter, in the Store on fakeredis, Redis and a cluster (with a
partitioned topic), and against real brokers, publishers and relay-admin."""

import json

import pytest

from relay.codec import FRAME_ERROR, FRAME_RESPONSE, parse_record
from relay.errors import StoreError
from relay.store import Store, deadletter, lookup
from relay.store.connection import connect
from relay.store.data_path import INLINE_BODIES
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.limits import Limit
from tests.helpers.admin import relay_admin
from tests.helpers.api import Api
from tests.helpers.servers import flush
from tests.helpers.wire import Wire, subscribed

FULL = "channel t/c is full (max depth 3)"
OK = (FRAME_RESPONSE, b"OK")


def bodies(store, topic="t", channel="c") -> list[bytes]:
    """The bodies queued on the channel, oldest first, over its parts."""
    return [parse_record(r)[3] for part in store.parts(topic)
            for r in store.redis.lrange(ChannelKeys.of(part, channel).queue, 0, -1)]


def limited(store, max_depth=3, overflow="reject", channels=("c", "d")):
    for channel in channels:
        store.subscribe("t", channel, "b1")
    assert store.limits.set_limit("t", "c", Limit(max_depth, overflow)) is True


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
    assert store.reads.read_channel("t", "c")["message_count"] == 3


def test_reject_counts_the_queue_only(store):
    """Depth as nsqd's: in flight and deferred messages are not counted, and a deferred
    publish is not refused."""
    limited(store)
    store.publish("t", [b"1", b"2", b"3"])
    store.deliver("t", "c", [("o", 60_000, 2)])
    store.publish("t", [b"later"] * 5, defer_ms=60_000)
    assert store.publish("t", [b"4", b"5"]) == 10
    assert store.reads.read_channel("t", "c")["depth"] == 3


def test_drop_oldest_keeps_the_newest_and_counts(store):
    limited(store, overflow="drop-oldest")
    store.publish("t", [b"1", b"2", b"3", b"4", b"5"])
    store.publish("t", [b"6"])
    assert bodies(store) == [b"4", b"5", b"6"]
    assert bodies(store, channel="d") == [b"1", b"2", b"3", b"4", b"5", b"6"]
    state = store.reads.read_channel("t", "c")
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
    assert store.reads.read_channel("t", "c")["overflow_count"] == 2
    store.limits.set_limit("t", "c", None)
    progress = list(deadletter.redrive(store, "t", "c"))
    assert progress[-1]["requeued"] == 2
    assert sorted(bodies(store)) == [b"1", b"2", b"3", b"4"]


def test_split_entry_tells_tagged_entries_from_records():
    record = b"\x80" + bytes(9) + b"body" + b"0" * 16 + b"\x01"
    assert deadletter.split_entry(record) == ("max_attempts", record)
    assert deadletter.split_entry(b"overflow:" + record) == ("overflow", record)
    assert deadletter.split_entry(b"expired:" + record) == ("expired", record)


def test_off_and_delete_keep_the_topic_count_of_limited_channels(store):
    limited(store)
    meta = TopicKeys.of("t").meta
    assert store.redis.hget(meta, "limited_channels") == b"1"
    store.limits.set_limit("t", "c", Limit(5, "drop-oldest"))      # a change is no new one
    assert store.redis.hget(meta, "limited_channels") == b"1"
    assert store.limits.limit("t", "c") == Limit(5, "drop-oldest")
    store.limits.set_limit("t", "c", None)
    assert store.redis.hget(meta, "limited_channels") == b"0"
    assert store.limits.limit("t", "c") is None
    store.publish("t", [b"m"] * 10)
    assert store.reads.read_channel("t", "c")["depth"] == 10
    store.limits.set_limit("t", "d", Limit(1, "reject"))
    assert store.control.delete_channel("t", "d") is True
    assert store.redis.hget(meta, "limited_channels") == b"0"
    assert store.limits.set_limit("t", "nope", Limit(1, "reject")) is False


def test_a_partitioned_topic_holds_its_share_on_every_part(store):
    store.control.set_partitions("t", 2)
    limited(store, max_depth=3, channels=("c",))        # 2 per part
    for n in range(4):
        store.publish("t", [b"%d" % n])
    with pytest.raises(StoreError) as e:
        store.publish("t", [b"4"])
    assert str(e.value) == FULL
    assert len(bodies(store)) == 4
    store.limits.set_limit("t", "c", Limit(3, "drop-oldest"))
    for n in range(4, 8):
        store.publish("t", [b"%d" % n])
    assert sorted(bodies(store)) == [b"4", b"5", b"6", b"7"]
    assert store.reads.read_channel("t", "c")["overflow_count"] == 4
    store.control.set_partitions("t", 3)                        # 1 per part now, the new one too
    for part in store.parts("t"):
        meta = ChannelKeys.of(part, "c").meta
        assert store.redis.hmget(meta, "max_depth", "part_max_depth") == [b"3", b"1"]
        assert store.redis.hget(TopicKeys.of(part).meta, "limited_channels") == b"1"
    for n in range(8, 11):
        store.publish("t", [b"%d" % n])
    assert sorted(bodies(store)) == [b"10", b"8", b"9"]


# -- real brokers, publishers and relay-admin ----------------------------------------------

REFUSED = {command: (FRAME_ERROR, f"E_{command}_FAILED {command} failed: {FULL}".encode())
           for command in ("PUB", "MPUB")}


def admin_ok(url, *args) -> str:
    done = relay_admin(url, *args)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return done.stdout


def created(api, topic="t", channels=("c",)):
    assert api.request("POST", f"/topic/create?topic={topic}")[0] == 200
    for channel in channels:
        assert api.request("POST", f"/channel/create?topic={topic}&channel={channel}")[0] == 200


@pytest.mark.integration
@pytest.mark.cluster
def test_reject_over_tcp_and_http_on_every_broker(processes, redis_url):
    """Set after both brokers started, the limit holds on each at its next publish; a
    refused MPUB publishes nothing."""
    _, one = processes.broker()
    _, two = processes.broker()
    api = Api(one, processes.http_ports[one])
    created(api, channels=("c", "d"))
    assert "reject" in admin_ok(redis_url, "limit", "t", "c", "--max-depth", "3")
    assert Wire(one).mpub("t", [b"1", b"2"]) == OK
    for port in (one, two):
        wire = Wire(port)
        assert wire.mpub("t", [b"x", b"y"]) == REFUSED["MPUB"]
        assert wire.closed()
    assert Wire(two).pub("t", b"3") == OK
    wire = Wire(one)
    assert wire.pub("t", b"4") == REFUSED["PUB"]
    assert wire.closed()
    for path, body in (("/pub?topic=t", b"5"), ("/mpub?topic=t", b"5\n6")):
        assert Api(two, processes.http_ports[two]).json("POST", path, body) == \
            (503, {"message": FULL})
    store = Store(connect(redis_url))
    assert bodies(store) == bodies(store, channel="d") == [b"1", b"2", b"3"]
    assert store.reads.read_channel("t", "c")["message_count"] == 3


@pytest.mark.integration
@pytest.mark.cluster
def test_drop_oldest_and_dead_letter_with_consumers_and_the_scanner(processes, redis_url):
    _, port = processes.broker()
    processes.scanner()
    created(Api(port, processes.http_ports[port]), channels=("c", "d"))
    admin_ok(redis_url, "limit", "t/c", "--max-depth", "2", "--overflow", "drop-oldest")
    admin_ok(redis_url, "limit", "t", "d", "--max-depth", "2", "--overflow", "dead-letter")
    assert Wire(port).mpub("t", [b"1", b"2", b"3", b"4"]) == OK
    assert Wire(port).pub("t", b"5") == OK
    consumer = subscribed(port, "t", "c", rdy=10)
    assert [consumer.message()[3] for _ in range(2)] == [b"4", b"5"]
    assert consumer.nothing()
    shown = json.loads(admin_ok(redis_url, "limit", "t", "c", "--json"))
    assert (shown["max_depth"], shown["overflow"], shown["overflow_count"]) == \
        (2, "drop-oldest", 3)
    dead = subscribed(port, "t.dead", "x", rdy=10)      # the scanner forwards d's oldest
    letters = [json.loads(dead.message()[3]) for _ in range(3)]
    assert [(x["channel"], x["reason"], x["body"]) for x in letters] == \
        [("d", "overflow", "1"), ("d", "overflow", "2"), ("d", "overflow", "3")]
    stats = Api(port, processes.http_ports[port]).json("GET", "/stats?format=json&topic=t")[1]
    counts = {c["channel_name"]: c["overflow_count"] for c in stats["topics"][0]["channels"]}
    assert counts == {"c": 3, "d": 3}
    metrics = Api(port, processes.http_ports[port]).request("GET", "/metrics")[1].decode()
    assert 'relay_channel_overflowed_total{channel="c",topic="t"} 3.0' in metrics


@pytest.mark.integration
@pytest.mark.cluster
def test_a_partitioned_topic_holds_the_limit_per_part(processes, redis_url):
    _, port = processes.broker()
    admin_ok(redis_url, "create", "t", "--partitions", "2")
    created(Api(port, processes.http_ports[port]))
    admin_ok(redis_url, "limit", "t", "c", "--max-depth", "3")      # 2 per part
    accepted = 0
    while (reply := Wire(port).pub("t", b"%d" % accepted)) == OK:
        accepted += 1
    assert reply == REFUSED["PUB"]
    store = Store(connect(redis_url))
    depths = [p["depth"] for p in store.reads.read_channel_parts("t", "c")]
    assert 3 <= accepted == sum(depths) <= 4 and max(depths) == 2
    shown = admin_ok(redis_url, "limit", "t", "c").splitlines()
    assert shown[0].split() == ["channel", "max_depth", "per_partition", "overflow", "depth",
                                "overflowed"]
    assert shown[1].split() == ["t/c", "3", "2", "reject", str(accepted), "0"]


@pytest.mark.integration
def test_bad_input_is_one_line_and_changes_nothing(redis_url):
    flush(redis_url)
    store = Store(connect(redis_url))
    store.subscribe("t", "c", "")
    admin_ok(redis_url, "limit", "t", "c", "--max-depth", "5", "--overflow", "drop-oldest")
    for args, code, text in [
            (("--max-depth", "-1"), 2, "Invalid value for '--max-depth': -1 is not in the "
                                       "range x>=1"),
            (("--max-depth", "many"), 2, "Invalid value for '--max-depth': 'many' is not a "
                                         "valid integer range"),
            (("--max-depth", "3", "--overflow", "spill"), 2, "Invalid value for '--overflow'"),
            (("--overflow", "reject"), 2, "--overflow goes with --max-depth"),
            (("--off", "--max-depth", "3"), 2, "--off takes neither"),
            (("nope", "--max-depth", "3"), 1, "channel t/nope not found"),
    ]:
        done = relay_admin(redis_url, "limit", "t", *args)
        assert (done.returncode, done.stdout) == (code, "")
        assert len(done.stderr.splitlines()) == 1 and text in done.stderr, done.stderr
    done = relay_admin(redis_url, "limit", "nope", "c", "--max-depth", "3")
    assert (done.returncode, done.stderr) == (1, "relay-admin: topic 'nope' not found\n")
    assert store.limits.limit("t", "c") == Limit(5, "drop-oldest")
    assert admin_ok(redis_url, "limit", "t", "c", "--off") == "t/c: no depth limit (depth 0)\n"
    assert store.limits.limit("t", "c") is None


def test_a_keyed_publish_refused_for_depth_is_not_remembered_as_published(store):
    """With a dedup window (issue 39), a refusal writes nothing, so the same keys are
    published once the queue has room."""
    limited(store, max_depth=2, channels=("c",))
    store.dedup.set_dedup("t", 60_000)
    keys = [b"k1", b"k2", b"k3"]
    with pytest.raises(StoreError, match="is full"):
        store.run(store.publish_op("t", [b"1", b"2", b"3"], publish_keys=keys))
    store.run(store.publish_op("t", [b"1", b"2"], publish_keys=keys[:2]))
    assert bodies(store) == [b"1", b"2"]
