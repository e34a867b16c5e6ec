"""relay-admin against real processes: a `relay jobs` rq worker, brokers with real NSQ
clients, and relay-admin itself as a subprocess."""

import json
import os
import subprocess
import sys
import time

import gnsq
import pytest
from click.testing import CliRunner

from relay import admin
from relay.codec import parse_record
from relay.store import Store
from relay.store.connection import connect
from relay.store.keys import ChannelKeys
from workers import operations
from tests.helpers.admin import RELAY_ADMIN, relay_admin
from tests.helpers.gnsq_clients import consumer, publish, stop
from tests.helpers.jobs import Producer, fill
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

def test_empty_of_a_big_channel_runs_in_a_real_jobs_worker(processes, redis_url):
    store = Store(connect(redis_url))
    processes.jobs()
    store.subscribe("t", "c", "")
    fill(store, "t", 50_000)
    assert wait_for(lambda: operations.has_worker(store.redis), 20)
    producer = Producer(Store(connect(redis_url)), "t")
    producer.start()
    assert wait_for(lambda: len(producer.bodies) >= 100)
    done = relay_admin(redis_url, "empty", "t/c")
    producer.stop()

    assert done.returncode == 0, done.stderr
    cut = int(done.stdout.rsplit("ids up to ", 1)[1].rstrip(")\n"), 16)
    dropped = 50_000 + sum(1 for i in producer.bodies if i <= cut)
    assert done.stdout == f"emptied t/c: {dropped} messages dropped (ids up to {cut:016x})\n"
    assert done.stderr == "empty t/c\n"
    kept = [body for i, body in sorted(producer.bodies.items()) if i > cut]
    assert kept and dropped > 50_000
    queue = store.redis.lrange(ChannelKeys.of("t", "c").queue, 0, -1)
    assert [parse_record(r)[3] for r in queue] == kept
    assert store.redis.keys("relay:{t}:trash:*") == []
    listed = json.loads(relay_admin(redis_url, "jobs", "--json").stdout)["jobs"]
    assert [(j["operation"], j["target"], j["state"], j["done"] == j["total"])
            for j in listed] == [("empty", "t/c", "finished", True)]


def test_tail_reads_through_an_ephemeral_channel(processes, redis_url):
    _, port = processes.broker("--broadcast-address", "127.0.0.1")
    store = Store(connect(redis_url))
    store.control.create_channel("t", "archive")
    store.publish("t", [b"before"])
    tail = subprocess.Popen([RELAY_ADMIN, "tail", "t", "-n", "3"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "REDIS_URL": redis_url})
    assert wait_for(lambda: len(store.reads.channel_names("t")) == 2)
    [channel] = [c for c in store.reads.channel_names("t") if c != "archive"]
    assert channel.startswith("tail") and channel.endswith("#ephemeral")
    store.publish("t", [b"one", b"two", b"three", b"four"])
    out, err = tail.communicate(timeout=10)
    assert (tail.returncode, out, err) == (0, b"one\ntwo\nthree\n", b"")
    assert wait_for(lambda: store.reads.channel_names("t") == ["archive"])
    assert store.reads.read_channel("t", "archive")["depth"] == 5


def test_tail_aimed_at_an_http_port_says_so_in_one_line(processes, redis_url):
    _, port = processes.broker("--broadcast-address", "127.0.0.1")
    Store(connect(redis_url)).control.create_topic("t")
    for http in (processes.http_ports[port], processes.lookupd_ports[port]):
        tail = relay_admin(redis_url, "tail", "t", "--broker", f"127.0.0.1:{http}")
        assert (tail.returncode, tail.stdout, tail.stderr) == (
            1, "", f"relay-admin: cannot tail t on 127.0.0.1:{http}: it answers HTTP: give "
                   "the broker's TCP port (--tcp-address, e.g. 4150), not an HTTP port\n")


def test_stats_and_brokers_show_the_clients_of_two_real_brokers(processes, redis_url):
    proc1, port1 = processes.broker("--broadcast-address", "127.0.0.1")
    _, port2 = processes.broker("--broadcast-address", "127.0.0.1")
    got = []
    c1 = consumer(port1, "t", "a", lambda m: (got.append(m.body), m.finish()))
    c2 = consumer(port2, "t", "b", lambda m: (got.append(m.body), m.finish()))
    store = Store(connect(redis_url))
    # both channels exist before the publish (a channel created later gets none of it)
    assert wait_for(lambda: [store.reads.read_channel("t", ch)["client_count"] for ch in "ab"]
                    == [1, 1], 20)
    publish(port1, "t", [b"x", b"y"])
    assert wait_for(lambda: len(got) == 4, 20)

    def clients():
        result = CliRunner().invoke(admin.main, ["stats", "--json", "--redis-url", redis_url])
        return {c["channel_name"]: c["clients"]
                for c in json.loads(result.stdout)["topics"][0]["channels"]}

    assert wait_for(lambda: [[c["finish_count"] for c in channel]
                             for channel in clients().values()] == [[2], [2]], 15)
    live = json.loads(relay_admin(redis_url, "brokers", "--json").stdout)["brokers"]
    ids = {int(b["tcp_port"]): b["id"] for b in live}
    assert sorted(ids) == sorted([port1, port2])
    by_channel = clients()
    for channel, port in (("a", port1), ("b", port2)):
        [c] = by_channel[channel]
        assert (c["broker"], c["topic"], c["channel"], c["state"], c["user_agent"],
                c["in_flight_count"], c["message_count"], c["finish_count"],
                c["requeue_count"]) == (ids[port], "t", channel, 3,
                                        f"gnsq/{gnsq.__version__}", 0, 2, 2, 0)
        assert c["owner"].startswith(ids[port] + ":")
        assert abs(c["connect_ts"] - time.time()) < 30
    brokers_table = relay_admin(redis_url, "brokers").stdout.splitlines()
    assert brokers_table[0].split() == ["broker", "address", "http_port", "version", "clients"]
    assert sorted(line.split()[1:] for line in brokers_table[1:3]) == sorted(
        [[f"127.0.0.1:{p}", str(processes.http_ports[p]), "1.3.0", "1"] for p in ids])

    stop(c1)
    proc1.terminate()
    proc1.wait(15)
    assert list(clients()) == ["a", "b"] and clients()["a"] == []
    assert [c["broker"] for c in clients()["b"]] == [ids[port2]]
    stop(c2)


CONSUMER = """
import socket, struct, sys, time
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
sock.sendall(b"  V2SUB t c\\nRDY 1\\n")
assert sock.recv(10)[-2:] == b"OK"
print("subscribed", flush=True)
time.sleep(60)
"""


def test_a_consumer_that_goes_away_without_cls_leaves_both_views_within_a_second(
        processes, redis_url):
    """Killed with -9 (its socket closed by the kernel) or its socket closed: the list of
    clients and the clients column agree, and it is out of both within a second."""
    brokers = [processes.broker("--broadcast-address", "127.0.0.1")[1] for _ in range(2)]

    def views():
        result = CliRunner().invoke(admin.main, ["stats", "t/c", "--json", "--redis-url",
                                                 redis_url])
        [channel] = json.loads(result.stdout)["topics"][0]["channels"]
        return channel["client_count"], len(channel["clients"])

    for port, ends in zip(brokers, ("kill -9", "close")):
        proc = subprocess.Popen([sys.executable, "-c", CONSUMER, str(port)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "subscribed\n"
        assert wait_for(lambda: views() == (1, 1), 5)
        time.sleep(1)   # the broker's announcement of it is done: it waits for news
        if ends == "kill -9":
            proc.kill()
        else:
            proc.send_signal(15)  # Python's default: the process ends, the kernel closes
        left = time.monotonic()
        seen = set()
        while (view := views()) != (0, 0) and time.monotonic() - left < 10:
            seen.add(view)
        gone = time.monotonic() - left
        proc.wait(5)
        assert gone < 1.0, (ends, gone)
        assert seen <= {(1, 1)}, ends   # never 0 counted with the client still listed
