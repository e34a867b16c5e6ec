"""A dead broker is reaped: reap.lua on every backend, the Reaper's decisions, and
kill -9 of a real broker next to a surviving one (workers/reaper.py)."""

import http.client
import json
import signal
import time

import pytest

from relay.broker.registry import TTL_MS
from relay.store import keys
from relay.store.keys import ChannelKeys, TopicKeys
from workers.reaper import GRACE, Reaper
from tests.helpers.clock import Clock
from tests.helpers.store import bodies, empty_channel, queue, subscribed
from tests.helpers.wire import FRAME_RESPONSE, Wire


def leased(store, topic, channel, owner, n):
    return store.deliver(topic, channel, [(owner, 60_000, n)])[0]


# -- reap.lua --------------------------------------------------------------------

def test_reap_takes_out_the_dead_brokers_consumers_and_requeues_its_leases(store):
    subscribed(store, "t", "c", "b1")
    store.subscribe("t", "c", "b1")
    store.subscribe("t", "c", "b10")
    store.publish("t", [b"1", b"2", b"3", b"4"])
    leased(store, "t", "c", "b1:7", 2)
    leased(store, "t", "c", "b10:1", 1)     # another broker whose id starts the same
    assert store.run(store.reap_op("t", "c", "b1")) == (0, 2)
    assert store.redis.hgetall(ChannelKeys.of("t", "c").consumers) == {b"b10": b"1"}
    assert bodies(queue(store, "t", "c")) == [b"4", b"1", b"2"]
    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=3, in_flight_count=1, message_count=4, requeue_count=2, client_count=1)
    # a second reaper, or a reap redone after a crash, finds nothing more
    assert store.run(store.reap_op("t", "c", "b1")) == (0, 0)
    assert store.reads.read_channel("t", "c")["requeue_count"] == 2


def test_reap_deletes_an_ephemeral_channel_and_topic_left_without_consumer(store):
    topic = "t#ephemeral"
    subscribed(store, topic, "a#ephemeral", "b1")
    subscribed(store, topic, "b#ephemeral", "b1")
    store.subscribe(topic, "b#ephemeral", "b2")
    store.publish(topic, [b"1"])
    leased(store, topic, "a#ephemeral", "b1:1", 1)
    assert store.run(store.reap_op(topic, "a#ephemeral", "b1")) == (1, 0)
    assert [k for k in ChannelKeys.of(topic, "a#ephemeral").all() if store.redis.exists(k)] == []
    assert store.run(store.reap_op(topic, "b#ephemeral", "b1")) == (0, 0)
    assert store.reads.channel_names(topic) == ["b#ephemeral"]
    store.run(store.reap_op(topic, "b#ephemeral", "b2"))
    assert store.run(store.reap_op(topic, "b#ephemeral", "b2")) == (0, 0)  # already gone
    assert not store.redis.exists(TopicKeys.of(topic).meta)
    assert store.reads.channel_names(topic) == []


# -- the Reaper ------------------------------------------------------------------

def expired(store, broker_id):
    """A registration that ran out a moment ago, as a broker killed with -9 leaves it."""
    store.redis.zadd(keys.BROKERS, {broker_id: int(time.time() * 1000) - 1})


def alive(store, broker_id):
    store.redis.zadd(keys.BROKERS, {broker_id: int(time.time() * 1000) + TTL_MS})


def test_reaper_reaps_a_broker_that_expired_at_once_and_only_once(store):
    subscribed(store, "t#ephemeral", "e#ephemeral", "dead")
    subscribed(store, "t", "c", "dead")
    store.subscribe("t", "c", "live")
    store.publish("t", [b"1"])
    leased(store, "t", "c", "dead:1", 1)
    alive(store, "dead")
    alive(store, "live")
    clock = Clock()
    reaper = Reaper(store, "r1", clock)
    topics = store.reads.topic_names()
    reaper.check(topics)
    assert store.reads.read_channel("t", "c")["client_count"] == 2
    expired(store, "dead")
    store.redis.set(keys.reap_claim_key("dead"), "r2")    # another reaper is at it
    clock.now += 1
    reaper.check(topics)
    assert reaper.reaped == 0
    assert store.reads.read_channel("t", "c")["client_count"] == 2
    store.redis.delete(keys.reap_claim_key("dead"))       # it died: its claim expired
    clock.now += 1
    reaper.check(topics)
    assert reaper.reaped == 1
    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=1, message_count=1, requeue_count=1, client_count=1)
    assert store.reads.topic_names() == ["t"]
    assert store.redis.get(keys.reap_claim_key("dead")) == b"done"
    other = Reaper(store, "r2", clock)           # one that starts later skips it
    other.check(topics)
    assert other.reaped == 0


def test_reaper_gives_an_unregistered_consumer_grace(store):
    """A broker may count a consumer just before its first heartbeat."""
    subscribed(store, "t", "c", "starting")
    clock = Clock()
    reaper = Reaper(store, "r1", clock)
    reaper.check(["t"])
    assert reaper.reaped == 0
    clock.now += GRACE
    alive(store, "starting")
    reaper.check(["t"])
    assert reaper.reaped == 0
    assert store.reads.read_channel("t", "c")["client_count"] == 1
    store.redis.zrem(keys.BROKERS, "starting")
    reaper.check(["t"])                          # within CHECK_EVERY: not looked at
    clock.now += GRACE
    reaper.check(["t"])                          # seen to leave: reaped at once
    assert reaper.reaped == 1
    assert store.reads.read_channel("t", "c")["client_count"] == 0


# -- a broker killed with -9 -----------------------------------------------------

def stats(processes, port, topic):
    conn = http.client.HTTPConnection("127.0.0.1", processes.http_ports[port], timeout=5)
    conn.request("GET", f"/stats?format=json&topic={topic}")
    data = json.loads(conn.getresponse().read())
    conn.close()
    return {c["channel_name"]: (c["client_count"], len(c["clients"]), c["in_flight_count"])
            for t in data["topics"] for c in t["channels"]}


def killed_with_messages_in_flight(processes, n):
    """Broker A's consumers hold n messages of t/work in flight and one of t/e#ephemeral;
    a consumer on broker B waits with RDY 0. A is killed with -9: (B's port, its
    consumer, when A died)."""
    proc, port_a = processes.broker("--msg-timeout", "60s")
    _, port_b = processes.broker("--msg-timeout", "60s")
    survivor = Wire(port_b, timeout=TTL_MS / 1000 + 10)
    survivor.identify()
    assert survivor.sub("t", "work") == (FRAME_RESPONSE, b"OK")
    holder, watcher = Wire(port_a), Wire(port_a)
    assert holder.sub("t", "work", rdy=n) == (FRAME_RESPONSE, b"OK")
    assert watcher.sub("t", "e#ephemeral", rdy=1) == (FRAME_RESPONSE, b"OK")
    assert Wire(port_b).mpub("t", [b"%d" % i for i in range(n)]) == (FRAME_RESPONSE, b"OK")
    assert sorted(holder.message()[3] for _ in range(n)) == sorted(b"%d" % i for i in range(n))
    assert watcher.message()[3] == b"0"
    assert stats(processes, port_b, "t") == {"work": (2, 1, n), "e#ephemeral": (1, 0, 1)}
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return port_b, survivor, time.monotonic()


@pytest.mark.integration
@pytest.mark.cluster
def test_killed_broker_is_reaped_within_its_registration_ttl(processes, deployment):
    """Its ephemeral channel goes, its in-flight messages come back at once (not after
    the 60 s msg timeout), and the survivor's /stats stops counting its client."""
    processes.scanner()
    port_b, survivor, died = killed_with_messages_in_flight(processes, 3)
    survivor.command("RDY 10")
    redelivered = [survivor.message() for _ in range(3)]
    assert time.monotonic() - died < TTL_MS / 1000 + 2
    assert sorted((m[1], m[3]) for m in redelivered) == [(2, b"0"), (2, b"1"), (2, b"2")]
    assert stats(processes, port_b, "t") == {"work": (1, 1, 3)}
    assert survivor.nothing(1.0)


@pytest.mark.integration
@pytest.mark.cluster
def test_two_reapers_requeue_each_message_once(processes, deployment):
    processes.scanner()
    processes.scanner()
    port_b, survivor, died = killed_with_messages_in_flight(processes, 50)
    survivor.command("RDY 100")
    redelivered = [survivor.message() for _ in range(50)]
    assert time.monotonic() - died < TTL_MS / 1000 + 2
    assert sorted(m[3] for m in redelivered) == sorted(b"%d" % i for i in range(50))
    assert {m[1] for m in redelivered} == {2}
    assert survivor.nothing(2.0)
    assert stats(processes, port_b, "t") == {"work": (1, 1, 50)}
