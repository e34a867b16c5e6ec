"""relay-admin msg and peek through click's CliRunner, on fakeredis, a real Redis and a
cluster: a message in each place, --delete, peek of a queue and of deferred messages,
and bad input."""

import subprocess
import sys

import pytest

from relay.admin.text import utc
from relay.broker import registry
from relay.store import Store, deadletter
from relay.store.connection import connect
from relay.store.keys import ChannelKeys
from relay.store.lookup import message
from tests.helpers.admin import ok, ok_json, relay_admin, run
from tests.helpers.wait import wait_for
from tests.test_admin import announce, client

HEAD = "channel  state      attempts  position  due                       broker  client"


def published_at(store, topic="t", channel="d", index=0) -> str:
    """The publish time relay-admin shows of a message queued on `channel`."""
    record = store.redis.lindex(ChannelKeys.of(topic, channel).queue, index)
    return utc(message(record)["timestamp"] // 1_000_000)


def due_of(store, msg_id, channel="c") -> str:
    c = ChannelKeys.of("t", channel)
    score = store.redis.zscore(c.deferred, msg_id)
    if score is None:
        [(_, score)] = [(m, s) for m, s in store.redis.zrange(c.inflight, 0, -1, withscores=True)
                        if m.startswith(msg_id.encode())]
    return utc(int(score))


@pytest.fixture
def places(store, backend):
    """On t/c: message 1 in flight held by b1:4 (announced), 2 3 5 6 queued, 4 deferred;
    on t/d: all queued but 4 (deferred)."""
    store.subscribe("t", "c", "b1")
    store.subscribe("t", "d", "b1")
    store.publish("t", [b"a", b"b\n\x00\xff", b"c"])
    store.publish("t", [b"later"], defer_ms=60000)
    store.publish("t", [b"e", b"f"])
    store.deliver("t", "c", [("b1:4", 60000, 1)])
    announce(backend, "b1", 4150, client("t", "c", "b1:4", "worker", 5001))
    return store


def test_msg_in_flight_queued_deferred(places, backend):
    store = places
    published = published_at(store)
    assert ok(backend, "msg", "t", "0000000000000001") == [
        f"message 0000000000000001 of t, published {published}, body \"a\"",
        HEAD,
        f"c        in flight  1         -         {due_of(store, '0000000000000001')}  b1      "
        "10.0.0.1:5001",
        "d        queued     0         1         -                         -       -"]
    assert ok(backend, "msg", "t", "0000000000000003")[2:] == [
        "c        queued  0         2         -    -       -",
        "d        queued  0         3         -    -       -"]
    assert ok(backend, "msg", "t", "0000000000000002")[0] == (
        f"message 0000000000000002 of t, published {published}, body \"b\\n\\x00\\xff\"")
    assert ok(backend, "msg", "t", "0000000000000004")[2:] == [
        f"c        deferred  0         -         {due_of(store, '0000000000000004')}  -       -",
        f"d        deferred  0         -         {due_of(store, '0000000000000004', 'd')}  -"
        "       -"]
    data = ok_json(backend, "msg", "t", "0000000000000001", "--channel", "c")
    assert data["body_base64"] == "YQ=="
    assert data["channels"] == [{
        "channel": "c", "state": "in_flight", "owner": "b1:4",
        "deadline_ms": data["channels"][0]["deadline_ms"], "timestamp": data["timestamp"],
        "attempts": 1, "broker": "b1", "connection": 4, "client": "10.0.0.1:5001"}]
    assert utc(data["channels"][0]["deadline_ms"]) == due_of(store, "0000000000000001")


def test_msg_dead_letter_and_finished(places, backend):
    store = places
    [[two]] = store.deliver("t", "c", [("b2:1", 60000, 1)])
    assert store.finish("t", "c", [("b2:1", b"0000000000000002")]) == [1]
    store.deliver("t", "c", [("b2:1", 60000, 1)])
    store.requeue("t", "c", [("b2:1", b"0000000000000003", 0)])      # queue: 5 6 3
    store.deliver("t", "c", [("b2:1", 60000, 3)], max_attempts=1)     # 3: dead
    assert ok(backend, "msg", "t", "0000000000000002")[1:] == [
        "channel  state      attempts  position  due  broker  client",
        "c        not there  -         -         -    -       -",
        "d        queued     0         2         -    -       -"]
    assert ok(backend, "msg", "t", "0000000000000003")[1:] == [
        "channel  state        attempts  position  due  broker  client",
        "c        dead letter  1         1         -    -       -",
        "d        queued       0         3         -    -       -"]
    assert ok(backend, "msg", "t", "0000000000000005")[2].split() == [
        "c", "in", "flight", "1", "-", due_of(store, "0000000000000005"), "b2", "#1"]
    assert deadletter.forward(store, "t", "c", "{topic}.dead") == 1
    assert ok(backend, "msg", "t", "0000000000000003", "--channel", "c")[1:] == [
        "channel  state        attempts  position  due  broker  client",
        "c        dead letter  1         -         -    -       -"]


def test_msg_of_an_id_in_capitals(store, backend):
    store.subscribe("t", "c", "b1")
    store.publish("t", [b"a"] * 10)
    store.redis.lpop(ChannelKeys.of("t", "c").queue)
    assert ok(backend, "msg", "t", "000000000000000A") == \
        ok(backend, "msg", "t", "000000000000000a")
    assert ok(backend, "msg", "t", "000000000000000A")[2].split()[:4] == [
        "c", "queued", "0", "9"]


def test_msg_delete_a_queued_and_a_deferred_one_but_not_in_flight(places, backend):
    store = places
    result = run(backend, "msg", "t", "0000000000000001", "--channel", "c", "--delete")
    assert (result.exit_code, result.output) == (1, (
        "relay-admin: message 0000000000000001 is in flight on t/c (broker b1, client "
        "10.0.0.1:5001): a consumer holds it, not deleted\n"))
    assert ok(backend, "msg", "t", "0000000000000003", "--channel", "c", "--delete") == [
        "deleted message 0000000000000003 from t/c (queued at position 2)"]
    assert ok_json(backend, "msg", "t", "0000000000000004", "--channel", "c", "--delete") == {
        "topic": "t", "channel": "c", "id": "0000000000000004", "deleted": "deferred"}
    c = store.reads.read_channel("t", "c")
    assert (c["depth"], c["in_flight_count"], c["deferred_count"], c["deleted_count"]) == (
        3, 1, 0, 2)
    assert store.redis.hlen(ChannelKeys.of("t", "c").msgs) == 1
    d = store.reads.read_channel("t", "d")
    assert (d["depth"], d["deferred_count"]) == (5, 1)          # the other channel kept them
    result = run(backend, "msg", "t", "0000000000000004", "--channel", "c", "--delete")
    assert (result.exit_code, result.output) == (1, (
        "relay-admin: message 0000000000000004 is not queued or deferred on t/c: "
        "nothing deleted\n"))
    assert store.reads.read_channel("t", "c")["deleted_count"] == 2


def test_peek_queue_and_deferred_without_taking(places, backend):
    store, c = places, ChannelKeys.of("t", "c")
    before = store.reads.read_channel("t", "c")
    published = published_at(store)
    assert ok(backend, "peek", "t", "c", "-n", "2") == [
        "part  position  id                attempts  published                 body",
        f"0     1         0000000000000002  0         {published}  \"b\\n\\x00\\xff\"",
        f"0     2         0000000000000003  0         {published}  \"c\""]
    assert ok(backend, "peek", "t", "c", "--deferred") == [
        "part  due                       id                attempts  published"
        "                 body",
        f"0     {due_of(store, '0000000000000004')}  0000000000000004  0         "
        f"{utc(message(store.redis.hget(c.msgs, '0000000000000004'))['timestamp'] // 10**6)}"
        "  \"later\""]
    data = ok_json(backend, "peek", "t", "d", "-n", "2")
    assert [(m["id"], m["position"], m["body_base64"]) for m in data["queued"]] == [
        ("0000000000000001", 1, "YQ=="), ("0000000000000002", 2, "YgoA/w==")]
    assert store.reads.read_channel("t", "c") == before
    store.control.empty_channel("t", "c")
    assert ok(backend, "peek", "t", "c") == ["nothing queued on t/c"]
    assert ok(backend, "peek", "t", "c", "--deferred") == ["nothing deferred on t/c"]


def test_msg_and_peek_on_a_partitioned_topic(store, backend):
    store.control.set_partitions("t", 2)
    store.subscribe("t", "c", "b1")
    for i in range(4):
        store.publish("t", [f"m{i}".encode()])
    ids = sorted(message(r)["id"] for p in store.parts("t")
                 for r in store.redis.lrange(ChannelKeys.of(p, "c").queue, 0, -1))
    assert ids == ["0000000000000001", "0000000000000002", "0001000000000001",
                   "0001000000000002"]
    assert [row.split()[:3] for row in ok(backend, "peek", "t", "c")[1:]] == [
        ["0", "1", "0000000000000001"], ["0", "2", "0000000000000002"],
        ["1", "1", "0001000000000001"], ["1", "2", "0001000000000002"]]
    assert ok(backend, "msg", "t", "0001000000000002")[2] == \
        "c        queued  0         2         -    -       -"
    assert ok(backend, "msg", "t", "0001000000000002", "--channel", "c", "--delete") == [
        "deleted message 0001000000000002 from t/c (queued at position 2)"]
    assert (store.reads.read_channel("t", "c")["depth"], store.reads.read_channel("t", "c")["deleted_count"],
            store.reads.read_channel_parts("t", "c")[1]["deleted_count"]) == (3, 1, 1)
    result = run(backend, "msg", "t", "0002000000000001")
    assert (result.exit_code, result.output) == (
        1, "relay-admin: message 0002000000000001 was never published on t\n")


@pytest.mark.parametrize("args, message", [
    (("msg", "nope", "0000000000000001"), "topic 'nope' not found"),
    (("msg", "t", "0000000000000001", "--channel", "nope"), "channel t/nope not found"),
    (("msg", "t", "xyz"), "invalid message id 'xyz': 16 hex digits"),
    (("msg", "t", "000000000000000G"), "invalid message id '000000000000000G': 16 hex digits"),
    (("msg", "t", "0000000000000009"), "message 0000000000000009 was never published on t"),
    (("msg", "t", "0000000000000001", "--delete"),
     "--delete needs --channel: the channel to take the message out of"),
    (("peek", "nope", "c"), "topic 'nope' not found"),
    (("peek", "t", "nope"), "channel t/nope not found"),
])
def test_bad_input_exits_1_with_one_line_and_changes_nothing(store, backend, args, message):
    store.subscribe("t", "c", "")
    store.publish("t", [b"a"])
    result = run(backend, *args)
    assert (result.exit_code, result.output) == (1, f"relay-admin: {message}\n")
    assert store.reads.read_channel("t", "c")["depth"] == 1


@pytest.mark.parametrize("args, message", [
    (("peek", "t", "c", "-n", "x"), "Invalid value for '-n' / '--limit': 'x' is not a valid "
                                    "integer range (see relay-admin peek --help)"),
    (("peek", "t", "c", "-n", "-1"), "Invalid value for '-n' / '--limit': -1 is not in the "
                                     "range x>=1 (see relay-admin peek --help)"),
    (("msg", "t"), "Missing argument 'ID' (see relay-admin msg --help)"),
])
def test_usage_errors_exit_2(backend, args, message):
    result = run(backend, *args)
    assert (result.exit_code, result.output) == (2, f"relay-admin: {message}\n")


HOLDER = """
import socket, sys, time
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
sock.sendall(b"  V2SUB t c\\nRDY 1\\n")
assert sock.recv(10)[-2:] == b"OK"
print("%s:%d" % sock.getsockname(), flush=True)
time.sleep(60)
"""


@pytest.mark.integration
def test_msg_shows_the_broker_and_client_of_a_real_consumer(processes, redis_url):
    """A raw NSQ consumer of a broker process holds message 1 (RDY 1, never FIN):
    relay-admin msg, run as a process, names the broker and the consumer's address,
    and --delete refuses it."""
    _, port = processes.broker("--broadcast-address", "127.0.0.1")
    store = Store(connect(redis_url))
    store.subscribe("t", "c", "")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(port)],
                              stdout=subprocess.PIPE, text=True)
    try:
        address = holder.stdout.readline().strip()
        store.publish("t", [b"held", b"waits"])
        assert wait_for(lambda: store.reads.read_channel("t", "c")["in_flight_count"] == 1, 10)
        [broker] = [b["id"] for b in registry.live_brokers(store.redis)]
        assert wait_for(lambda: address in relay_admin(redis_url, "msg", "t",
                                                       "0000000000000001").stdout, 10)
        shown = relay_admin(redis_url, "msg", "t", "0000000000000001")
        assert shown.stdout.splitlines()[2].split() == [
            "c", "in", "flight", "1", "-", due_of(store, "0000000000000001"), broker, address]
        refused = relay_admin(redis_url, "msg", "t", "0000000000000001", "--channel", "c",
                              "--delete")
        assert (refused.returncode, refused.stderr) == (1, (
            f"relay-admin: message 0000000000000001 is in flight on t/c (broker {broker}, "
            f"client {address}): a consumer holds it, not deleted\n"))
        assert relay_admin(redis_url, "msg", "t", "0000000000000002").stdout.splitlines()[2] \
            == "c        queued  0         1         -    -       -"
    finally:
        holder.kill()
        holder.wait(5)
