"""Wake-ups (relay/broker/wakeups.py): what the store's scripts publish on a topic's
wake channel and the topic versions they move, the broker's listener and its
once-a-second read of the versions, and a broker idle until a wake-up comes. Store
tests run on fakeredis, one Redis and the cluster."""

import dataclasses
import time
from types import SimpleNamespace

import gevent
import gnsq
import pytest

from relay import embedded
from relay.broker.wakeups import CHECK_SLICE, WakeupListener
from relay.store import Store
from relay.store.connection import connect, is_cluster
from relay.store.keys import TopicKeys
from tests.helpers.gnsq_clients import addr, stop
from tests.helpers.processes import Processes
from tests.helpers.servers import local_cluster
from tests.helpers.store import inflight_score, mid, subscribed, wait_past
from tests.helpers.wait import wait_for
from tests.helpers.wire import FRAME_RESPONSE, Wire


# -- what the store's scripts publish -------------------------------------------

def test_wake_notifications(store):
    """Brokers learn of news on a topic's wake channel: "" = whole topic, "C" = channel C,
    each after the topic's version it made and "|"."""
    wake = TopicKeys.of("t").wake
    sub = store.redis.pubsub()
    if is_cluster(store.redis):  # sharded pub/sub (relay/broker/wakeups.py)
        sub.ssubscribe(wake)
        get, kind = sub.get_sharded_message, "smessage"
    else:
        sub.subscribe(wake)
        get, kind = sub.get_message, "message"
    assert get(timeout=2)["type"] in ("subscribe", "ssubscribe")

    def next_wake():
        while True:
            msg = get(timeout=2)
            assert msg is not None, "no wake-up"
            if msg["type"] == kind:
                assert msg["channel"] == wake.encode()
                return msg["data"]

    store.publish("t", [b"backlog"])               # no channel: nobody to wake
    subscribed(store, "t", "c")
    store.publish("t", [b"1"], defer_ms=60_000)    # deferred: nothing ready
    store.publish("t", [b"2", b"3"])
    assert next_wake() == b"1|"
    store.deliver("t", "c", [("a", 1, 3)])
    store.requeue("t", "c", [("a", mid(1), 60_000)])   # deferred again: nothing ready
    store.requeue("t", "c", [("a", mid(3), 0)])
    assert next_wake() == b"2|c"
    wait_past(store, inflight_score(store, "t", "c", mid(4)))
    assert store.scan("t", "c")[0] == 1
    assert next_wake() == b"3|c"
    assert store.scan("t", "c")[:2] == (0, 0)       # nothing moved: no wake-up
    store.finish("t", "c", [("a", mid(9))])
    store.publish("t", [b"4"])
    assert next_wake() == b"4|"
    assert store.reads.versions(["t"]) == {"t": 4}
    sub.close()


def test_versions_move_with_every_wake_up_and_control_change(store):
    """What a broker reads once a second for the wake-ups it may have missed."""
    assert store.reads.versions(["t", "other"]) == {"t": 0, "other": 0}
    versions = [store.reads.versions(["t"])["t"]]

    def moved():
        versions.append(store.reads.versions(["t"])["t"])
        return versions[-1] != versions[-2]

    subscribed(store, "t", "c")
    assert not moved()                              # a new channel: no news
    store.publish("t", [b"1"], defer_ms=60_000)     # deferred: nothing ready
    assert not moved()
    store.publish("t", [b"2"])
    assert moved()
    store.deliver("t", "c", [("a", 60_000, 1)])
    assert not moved()
    store.requeue("t", "c", [("a", mid(2), 0)])
    assert moved()
    store.control.pause_channel("t", "c", True)
    store.control.pause_channel("t", "c", False)
    assert moved()
    store.control.empty_channel("t", "c")
    assert moved()
    store.control.delete_channel("t", "c")
    assert moved()
    assert store.reads.versions(["t", "other"]) == {"t": versions[-1], "other": 0}


# -- the broker's listener ---------------------------------------------------------

class LocalChannel:
    """What the wake-up listener tells one of a broker's channels."""

    name = "c"
    parts = [None]

    def __init__(self):
        self.told = []

    def messages_arrived(self, index=None):
        self.told.append(("look", index))

    def check(self, index, incarnation, empties):
        self.told.append(("check", index))


def test_the_once_a_second_read_looks_again_only_where_a_wake_up_was_missed(store):
    local = LocalChannel()
    listener = WakeupListener(SimpleNamespace(store=store, topics={"t": {"c": local}}))

    def told():
        out, local.told = local.told, []
        return out
    subscribed(store, "t", "c")
    listener.watch("t")
    listener.check_versions()               # new here: checked, and looks once
    assert told() == [("check", 0), ("look", 0)]
    store.publish("t", [b"1"])
    listener.received("t", b"1|")           # heard, in turn
    listener.check_versions()
    assert told() == [("look", 0)]
    store.publish("t", [b"2"])              # its wake-up lost
    store.publish("t", [b"3"])
    listener.received("t", b"3|")
    assert listener.versions["t"] == 1
    listener.check_versions()
    assert told() == [("look", 0), ("check", 0), ("look", 0)]
    assert listener.versions["t"] == 3
    listener.received("t", b"5|c")          # news 4 missed: not heard in turn
    assert (told(), listener.versions["t"]) == ([("look", 0)], 3)


def test_the_once_a_second_read_lets_the_broker_serve_between_its_slices(store):
    """At thousands of parts followed, the read goes CHECK_SLICE parts at a time and
    the other greenlets run in between: one read of 5,000 held the loop 20 ms, the
    worst wait of a PUB to an idle consumer (issue 57 item 3)."""
    listener = WakeupListener(SimpleNamespace(store=store, topics={}))
    parts = [f"t{i:04}" for i in range(3 * CHECK_SLICE)]
    for part in parts:
        listener.watch(part)
    seen = []

    def another_client():
        while True:
            seen.append(len(listener.versions))     # the parts read so far
            gevent.sleep(0)

    other = gevent.spawn(another_client)
    gevent.sleep(0)
    seen.clear()
    listener.check_versions()
    between = sorted(set(seen))
    other.kill()
    assert listener.versions == dict.fromkeys(parts, 0)
    assert between == [CHECK_SLICE, 2 * CHECK_SLICE]


def test_a_versions_read_that_finds_nothing_new_keeps_the_partition_counts_fresh(store):
    """A read whose reply is the same as the last one confirms the counts all at once,
    with no work per topic: a PUB after idle still needs no read of its count."""
    subscribed(store, "t", "c")
    store.publish("t", [b"1"])
    store.reads.versions(["t", "u"])          # the counts read
    store.reads.versions(["t", "u"])          # found current: the reply kept
    names, _ = store._partitions["t"]
    store._partitions["t"] = (names, time.monotonic() - 10)
    store._confirmed["t"].at -= 10      # both long ago
    assert store.reads.versions(["t", "u"]) == {"t": 1, "u": 0}     # the same reply

    def no_read(op):
        raise AssertionError("the count read again")
    store.lookup = no_read
    assert store.partitions("t") == 1
    assert store.parts_of(["t"]) == [["t"]]


def test_a_listener_waiting_on_its_connection_subscribes_a_new_part_at_once(single_redis_url):
    """The listener of one server waits for its pub/sub connection or a change of the
    parts followed, not polling: a part followed meanwhile is subscribed to at once,
    and its wake-ups heard."""
    client = connect(single_redis_url)
    store = Store(client)
    local = {"idle_a": LocalChannel(), "idle_b": LocalChannel()}
    listener = WakeupListener(SimpleNamespace(
        redis=client, store=store, topics={t: {"c": c} for t, c in local.items()}))
    running = gevent.spawn(listener.run)
    try:
        listener.watch("idle_a")
        assert wait_for(lambda: local["idle_a"].told == [("look", 0)], timeout=0.5)
        gevent.sleep(0.2)                   # the listener waits on its connection
        listener.watch("idle_b")
        assert wait_for(lambda: local["idle_b"].told == [("look", 0)], timeout=0.5)
        subscribed(store, "idle_b", "c")
        store.publish("idle_b", [b"1"])
        assert wait_for(lambda: len(local["idle_b"].told) == 2, timeout=0.5)
    finally:
        running.kill()
        client.close()


# -- brokers ----------------------------------------------------------------------

def commands_run(client) -> int:
    """Every command Redis ran (a script's own calls too), but the INFO calls that
    read this."""
    stats = client.info("all")
    return stats["total_commands_processed"] - stats["cmdstat_info"]["calls"]


@pytest.mark.integration
def test_idle_broker_with_a_waiting_consumer_barely_touches_redis(processes, redis_url):
    _, port = processes.broker()
    consumer = Wire(port)
    assert consumer.sub("quiet", "c", rdy=10) == (0, b"OK")
    client = connect(redis_url)
    time.sleep(2.0)  # past the first catch-up read, whose Store loads the scripts once
    before = commands_run(client)
    time.sleep(2.0)  # ends 1 s before the heartbeat, 5 s after the SUB's announcement
    during = commands_run(client) - before
    # the only traffic is the once-a-second read of the topics' versions: one script
    # that runs a command per topic
    assert during <= 3 * 2, during
    producer = Wire(port)
    assert producer.pub("quiet", b"wake up") == (0, b"OK")
    assert consumer.message()[3] == b"wake up"


@pytest.mark.integration
def test_an_idle_scanner_and_broker_cost_redis_a_bound_whatever_the_topics(processes,
                                                                           redis_url):
    """300 topics with an idle consumer each: a scanner pass reads one node due index and
    the broker's catch-up one node news hash (relay/store/nodes.py), whatever the number
    of topics; with heartbeats and the slow sweeps, well under 100 commands a second,
    where reading every topic's due index each pass and version each second cost 11
    commands a topic a second (3,300 here)."""
    _, port = processes.broker()
    processes.scanner()
    consumers = [Wire(port) for _ in range(300)]
    for i, consumer in enumerate(consumers):
        assert consumer.sub(f"many{i}", "c", rdy=1) == (FRAME_RESPONSE, b"OK")
    client = connect(redis_url)
    time.sleep(2.0)     # past the broker's first read of the new topics' versions
    before = commands_run(client)
    time.sleep(5.0)
    per_second = (commands_run(client) - before) / 5
    assert per_second <= 100, per_second
    for consumer in consumers:
        consumer.close()


@pytest.fixture
def unheard(monkeypatch, redis_url):
    """A Store in this process whose scripts publish their wake-ups where no broker
    listens (in the topic's slot): every notice is lost, as pub/sub may lose one."""
    of = TopicKeys.of
    monkeypatch.setattr(TopicKeys, "of", staticmethod(
        lambda topic: dataclasses.replace(of(topic), wake=f"relay:{{{topic}}}:nowhere")))
    return Store(connect(redis_url))


@pytest.mark.integration
@pytest.mark.cluster     # on one Redis and on a cluster (tests/conftest.py)
def test_what_a_lost_notice_said_is_applied_all_the_same(processes, unheard):
    _, port1 = processes.broker()
    _, port2 = processes.broker()
    consumer = Wire(port2)
    consumer.identify(msg_timeout=60000)
    assert consumer.sub("quiet", "c", rdy=1) == (FRAME_RESPONSE, b"OK")
    time.sleep(1.5)     # past the check of the channel new on broker 2

    unheard.publish("quiet", [b"unheard"])
    assert consumer.message()[3] == b"unheard"

    unheard.control.empty_channel("quiet", "c")     # frees the consumer's RDY 1
    producer = Wire(port1)
    assert producer.pub("quiet", b"after empty") == (FRAME_RESPONSE, b"OK")
    _, _, msg_id, body = consumer.message()
    assert body == b"after empty"

    unheard.control.pause_channel("quiet", "c", True)
    consumer.command(f"FIN {msg_id.decode()}")
    assert producer.pub("quiet", b"while paused") == (FRAME_RESPONSE, b"OK")
    assert consumer.nothing(wait=1.5)
    unheard.control.pause_channel("quiet", "c", False)
    assert consumer.message()[3] == b"while paused"

    unheard.control.delete_channel("quiet", "c")
    assert consumer.closed(timeout=3.5)   # the once-a-second read, with room to spare
    producer.close()


# -- a cluster: sharded pub/sub -------------------------------------------------

@pytest.mark.integration
def test_a_cluster_wakes_brokers_by_sharded_pubsub(tmp_path):
    """SPUBLISH in the functions, to the node of the topic's keys, and an SSUBSCRIBE per
    node in each broker. Consumers of topics on every master get each message at
    once, not at the brokers' 1 s catch-up read: each message after the first on a topic
    is published right after the previous one arrived, when a read is furthest away."""
    with local_cluster([embedded.free_port() for _ in range(3)]) as url:
        _wakes_across_masters(url, tmp_path)


def _wakes_across_masters(url: str, tmp_path) -> None:
    store = Store(connect(url))
    store.runner.load_library()
    assert store.cluster and store.runner.sharded is True
    processes = Processes(url, str(tmp_path))
    try:
        _, port = processes.broker()
        topics = [f"six{i}" for i in range(6)]
        assert len({owner_port(store, t) for t in topics}) > 1
        got = {t: [] for t in topics}
        consumers = []
        for topic in topics:
            # RDY 1: a consumer with credit left gets a message after nsqd's output
            # buffer timeout (250 ms), which left this test 25 ms of margin at RDY 5
            c = gnsq.Consumer(topic, "c", [addr(port)], max_in_flight=1)
            c.on_message.connect(lambda _, message, t=topic: got[t].append(
                (message.body, time.time())), weak=False)
            c.start(block=False)
            consumers.append(c)
        assert wait_for(lambda: all(store.reads.read_channel(t, "c")["client_count"] == 1
                                    for t in topics))
        gevent.sleep(1.5)   # every channel's loop is now idle, waiting for a wake-up
        producer = gnsq.Producer([addr(port)])
        producer.start()
        latencies = []
        for topic in topics:
            for i in range(3):
                sent = time.time()
                producer.publish(topic, b"hello %d" % i)
                assert wait_for(lambda: len(got[topic]) == i + 1, timeout=10)
                latencies.append(got[topic][i][1] - sent)
        producer.close()
        stop(*consumers)
        assert {t: [b for b, _ in got[t]] for t in topics} == \
            {t: [b"hello 0", b"hello 1", b"hello 2"] for t in topics}
        assert max(latencies) < 0.7, latencies   # not the 1 s catch-up read's
    finally:
        processes.stop_all()


def owner_port(store: Store, topic: str) -> int:
    return store.redis.get_node_from_key(TopicKeys.of(topic).ids).port
