"""Real NSQ clients (gnsq in-process on gevent, pynsq in its own process) against real
broker and scanner processes."""

import signal
import time

import gevent
import gnsq
import pytest

from relay.store import Store
from relay.store.connection import connect
from tests.helpers.api import client_count
from tests.helpers.gnsq_clients import addr, consumer, publish, round_trip, stop
from tests.helpers.pynsq import run_pynsq_client
from tests.helpers.wait import wait_for
from tests.helpers.wire import subscribed

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out


def test_gnsq_publish_consume_finish(broker, redis_url):
    got = []
    c = consumer(broker, "orders", "billing", lambda m: (got.append(m.body), m.finish()))
    publish(broker, "orders", [b"one", b"two", b"three"])
    assert wait_for(lambda: len(got) == 3)
    stop(c)
    store = Store(connect(redis_url))
    assert sorted(got) == [b"one", b"three", b"two"]
    assert wait_for(lambda: [store.reads.read_channel("orders", "billing")[field] for field in (
        "depth", "in_flight_count", "message_count")] == [0, 0, 3])   # the FINs committed


def test_gnsq_multipublish_fans_out_to_two_channels(broker, processes):
    a, b = [], []
    ca = consumer(broker, "fan", "a", lambda m: (a.append(m.body), m.finish()))
    cb = consumer(broker, "fan", "b", lambda m: (b.append(m.body), m.finish()))
    assert wait_for(lambda: client_count(processes.http_ports[broker], "fan") == 2)
    producer = gnsq.Producer([addr(broker)])
    producer.start()
    producer.multipublish("fan", [b"m%d" % i for i in range(100)])
    producer.close()
    assert wait_for(lambda: len(a) == 100 and len(b) == 100)
    stop(ca, cb)
    assert sorted(a) == sorted(b) == sorted(b"m%d" % i for i in range(100))


def test_backlog_before_first_channel_goes_to_it(broker, processes):
    """The backlog goes to the first channel only; a later channel gets what is
    published after it subscribed."""
    publish(broker, "early", [b"x", b"y"])
    got = []
    c = consumer(broker, "early", "late-comer", lambda m: (got.append(m.body), m.finish()))
    assert wait_for(lambda: len(got) == 2)
    later = []
    c2 = consumer(broker, "early", "second", lambda m: (later.append(m.body), m.finish()))
    assert wait_for(lambda: client_count(processes.http_ports[broker], "early", "second") == 1)
    publish(broker, "early", [b"z"])
    assert wait_for(lambda: later and len(got) == 3)
    stop(c, c2)
    assert sorted(got) == [b"x", b"y", b"z"]
    assert later == [b"z"]


def test_requeue_now_and_with_delay(broker):
    seen = []

    def handle(m):
        seen.append((m.body, m.attempts, time.monotonic()))
        if m.attempts == 1:
            m.requeue(0 if m.body == b"now" else 800, backoff=False)
        else:
            m.finish()

    c = consumer(broker, "req", "c", handle)
    publish(broker, "req", [b"now", b"later"])
    assert wait_for(lambda: len(seen) == 4)
    stop(c)
    by_body = {}
    for body, attempts, at in seen:
        by_body.setdefault(body, []).append((attempts, at))
    assert [a for a, _ in by_body[b"now"]] == [1, 2]
    assert [a for a, _ in by_body[b"later"]] == [1, 2]
    delay = by_body[b"later"][1][1] - by_body[b"later"][0][1]
    assert 0.75 <= delay < 5


def test_unfinished_message_is_redelivered_after_msg_timeout(processes):
    _, broker = processes.broker("--msg-timeout", "1s")
    processes.scanner()
    seen = []

    def handle(m):
        seen.append((m.id, m.attempts, time.monotonic()))
        if m.attempts >= 2:
            m.finish()

    c = consumer(broker, "slow", "c", handle)
    publish(broker, "slow", [b"job"])
    assert wait_for(lambda: len(seen) == 2)
    stop(c)
    (id1, att1, t1), (id2, att2, t2) = seen
    assert (id1 == id2, att1, att2) == (True, 1, 2)
    assert 0.9 <= t2 - t1 < 5


def test_touch_keeps_a_message_in_flight(processes):
    _, broker = processes.broker("--msg-timeout", "2s")
    processes.scanner()
    seen = []

    def handle(m):
        seen.append(m.attempts)
        if m.attempts == 1:
            def keep_alive():   # held 3.5 s, past the timeout, each TOUCH 1.5 s early
                for _ in range(7):
                    gevent.sleep(0.5)
                    m.touch()
                m.finish()
            gevent.spawn(keep_alive)

    c = consumer(broker, "touchy", "c", handle)
    publish(broker, "touchy", [b"long job"])
    gevent.sleep(4.5)
    stop(c)
    assert seen == [1]


def test_dpub_is_delivered_after_the_defer(broker, processes):
    seen = []
    c = consumer(broker, "later", "c", lambda m: (seen.append(time.monotonic()), m.finish()))
    assert wait_for(lambda: client_count(processes.http_ports[broker], "later") == 1)
    start = time.monotonic()
    publish(broker, "later", [b"tick"], defer=1000)
    assert wait_for(lambda: seen)
    stop(c)
    assert 0.95 <= seen[0] - start < 5


def test_closed_connection_requeues_its_messages_at_once(broker):
    """relay's choice: in-flight messages of a closed connection go back to the
    queue when it closes, not after msg_timeout (60 s here)."""
    first = []
    c1 = consumer(broker, "handoff", "c", first.append)  # never finishes
    publish(broker, "handoff", [b"a", b"b"])
    assert wait_for(lambda: len(first) == 1)
    stop(c1)
    second = []
    start = time.monotonic()
    c2 = consumer(broker, "handoff", "c", lambda m: (second.append((m.body, m.attempts)),
                                                     m.finish()))
    assert wait_for(lambda: len(second) == 2, timeout=5)
    stop(c2)
    assert sorted(second) == [(b"a", 2), (b"b", 1)]
    assert time.monotonic() - start < 5


def test_ephemeral_channel_is_removed_when_its_consumer_leaves(broker, redis_url):
    store = Store(connect(redis_url))
    c = consumer(broker, "eph", "tail#ephemeral", lambda m: m.finish())
    assert wait_for(lambda: store.reads.channel_names("eph") == ["tail#ephemeral"])
    stop(c)
    assert wait_for(lambda: store.reads.channel_names("eph") == [])


def test_two_brokers_behave_as_one(processes):
    _, port_a = processes.broker()
    _, port_b = processes.broker()
    processes.scanner()
    on_a, on_b = [], []
    ca = consumer(port_a, "shared", "work", lambda m: (on_a.append(m.body), m.finish()))
    cb = consumer(port_b, "shared", "work", lambda m: (on_b.append(m.body), m.finish()))
    assert wait_for(lambda: [client_count(processes.http_ports[p], "shared")
                             for p in (port_a, port_b)] == [1, 1])
    bodies = [b"%d" % i for i in range(200)]
    producer = gnsq.Producer([addr(port_a)])
    producer.start()
    for i in range(0, 200, 20):
        producer.multipublish("shared", bodies[i:i + 20])
        gevent.sleep(0.05)
    producer.close()
    assert wait_for(lambda: len(on_a) + len(on_b) == 200)
    stop(ca, cb)
    assert sorted(on_a + on_b) == sorted(bodies)
    assert not set(on_a) & set(on_b)
    assert on_a and on_b, "both brokers' consumers got a share"


def test_restart_of_every_broker_loses_no_message(processes, redis_url):
    """kill -9 both brokers while messages are queued and in flight; new brokers on new
    ports deliver every message (in-flight ones after their timeout, via the scanner)."""
    procs = [processes.broker("--msg-timeout", "2s")[0] for _ in range(2)]
    ports = [p.args[p.args.index("--tcp-address") + 1].rsplit(":", 1)[1] for p in procs]
    processes.scanner()
    bodies = [b"%04d" % i for i in range(500)]
    producer = gnsq.Producer([addr(ports[0])])
    producer.start()
    for i in range(0, 500, 50):
        producer.multipublish("durable", bodies[i:i + 50])
    producer.close()
    held = []
    c = consumer(int(ports[1]), "durable", "c", held.append)
    assert wait_for(lambda: len(held) >= 1)
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    stop(c)
    _, new_port = processes.broker()
    done = set()
    c2 = consumer(new_port, "durable", "c", lambda m: (done.add(m.body), m.finish()),
                  max_in_flight=100)
    assert wait_for(lambda: len(done) == 500, timeout=20)
    stop(c2)
    assert done == set(bodies)
    store = Store(connect(redis_url))
    assert wait_for(lambda: [store.reads.read_channel("durable", "c")[field] for field in (
        "depth", "in_flight_count", "deferred_count")] == [0, 0, 0])   # the FINs committed


def test_deferred_message_survives_broker_restart(processes):
    proc, port = processes.broker()
    processes.scanner()
    c = consumer(port, "dlater", "c", lambda m: m.finish())
    assert wait_for(lambda: client_count(processes.http_ports[port], "dlater") == 1)
    stop(c)
    publish(port, "dlater", [b"wake me"], defer=1500)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _, port2 = processes.broker()
    seen = []
    c2 = consumer(port2, "dlater", "c", lambda m: (seen.append(m.body), m.finish()))
    assert wait_for(lambda: seen, timeout=8)
    stop(c2)
    assert seen == [b"wake me"]


def test_pynsq_writer_and_reader(broker):
    assert run_pynsq_client("publish", broker, "py", "alpha", "beta") == [{"published": ["OK", "OK"]}]
    events = run_pynsq_client("consume", broker, "py", "c", 2)
    assert sorted((e["body"], e["attempts"]) for e in events) == [("alpha", 1), ("beta", 1)]
    assert all(len(e["id"]) == 16 for e in events)


def test_pynsq_requeue_with_delay(broker):
    publish(broker, "pyreq", [b"retry me"])
    events = run_pynsq_client("consume", broker, "pyreq", "c", 1, "--requeue-first", 500)
    assert [(e["body"], e["attempts"]) for e in events] == [("retry me", 1), ("retry me", 2)]
    assert 0.45 <= events[1]["at"] - events[0]["at"] < 5


def test_brokers_share_one_port_with_so_reuseport(processes):
    """Each broker serves on its own HTTP port, and the kernel spreads connections to
    the shared TCP port over both: each broker's /stats lists some of the clients."""
    first, port = processes.broker()
    second, second_http = processes.broker_sharing(port)
    processes.scanner()
    wires = [subscribed(port, "shared-port", "c") for _ in range(16)]
    counts = [client_count(http, "shared-port") for http in (processes.http_ports[port],
                                                              second_http)]
    assert sum(counts) == 16 and min(counts) > 0, counts
    for w in wires:
        w.close()
    round_trip(port, "shared-port", 20)
    assert first.poll() is None and second.poll() is None
