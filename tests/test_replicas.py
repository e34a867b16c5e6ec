"""A local cluster with replicas (`relay redis --cluster 3 --replicas 1`), and
--wait-replicas: a publish is acknowledged once replicas hold it, with one WAIT per
pipeline and node."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis

from relay import embedded
from relay.codec import FRAME_ERROR, make_record
from relay.errors import StoreError
from relay.store import deadletter
from relay.store import Store
from relay.store.connection import connect
from relay.store.keys import ChannelKeys, TopicKeys
from workers import operations
from tests.helpers.jobs import work
from tests.helpers.processes import Processes
from tests.helpers.servers import flush
from tests.helpers.wire import Wire, subscribed

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out


def roles(ports) -> dict:
    """port -> (role, connected replicas, node id)."""
    out = {}
    for port in ports:
        node = redis.Redis(port=port)
        info = node.info("replication")
        out[port] = (info["role"], embedded.attached_replicas(node), node.cluster("myid"))
    return out


def test_relay_redis_starts_a_cluster_with_replicas_and_restarts_it(tmp_path):
    first = embedded.free_ports(6)
    ports = range(first, first + 6)
    command = [sys.executable, "-m", "relay", "redis", "--cluster", "3", "--replicas", "1",
               "--redis-url", f"redis://127.0.0.1:{first}/0", "--data-dir", str(tmp_path)]

    def run() -> dict:
        proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            assert "3 masters and 3 replicas" in line, line
            return roles(ports)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0

    started = run()
    assert [started[p][:2] for p in ports] == [("master", 1)] * 3 + [("slave", 0)] * 3
    assert run() == started  # the same nodes, from their nodes.conf


def replica_of(url: str, ports, key: str) -> redis.Redis:
    """A client of the replica of the master serving `key`, in READONLY mode."""
    master = connect(url).get_node_from_key(key)
    for port in ports:
        client = redis.Redis(port=port, single_connection_client=True)
        if client.info("replication").get("master_port") == master.port:
            client.execute_command("READONLY")
            return client
    raise AssertionError(f"no replica of {master.name}")


def waits(url: str) -> dict:
    """WAIT calls so far, per master port."""
    cluster = connect(url)
    return {node.port: cluster.get_redis_connection(node).info("commandstats")
            .get("cmdstat_wait", {}).get("calls", 0) for node in cluster.get_primaries()}


@pytest.fixture
def waiting_broker(replicated, tmp_path):
    url, _, _ = replicated
    flush(url)
    procs = Processes(url, str(tmp_path))
    _, port = procs.broker("--wait-replicas", "1", "--redis-timeout", "2s")
    yield port
    procs.stop_all()


def test_an_acknowledged_publish_is_on_the_replica(replicated, waiting_broker):
    """The replica is stopped while the broker publishes: the OK waits for it."""
    url, procs, _ = replicated
    replica = replica_of(url, procs, TopicKeys.of("held").backlog)
    pid = procs[replica.connection_pool.connection_kwargs["port"]].pid
    wire = Wire(waiting_broker)
    for send, count in ((lambda: wire.pub("held", b"one"), 1),
                        (lambda: wire.mpub("held", [b"two", b"three"]), 3)):
        os.kill(pid, signal.SIGSTOP)
        resumed_at = []

        def resume():
            resumed_at.append(time.monotonic())
            os.kill(pid, signal.SIGCONT)
        resumed = threading.Timer(0.3, resume)
        resumed.start()
        assert send() == (0, b"OK")
        answered_at = time.monotonic()
        resumed.join()
        assert answered_at > resumed_at[0]      # the OK came once the replica ran again
        assert replica.llen(TopicKeys.of("held").backlog) == count


def test_one_wait_per_pipeline_and_node(replicated):
    """A pipeline of 30 publishes to topics on every master, and other calls: one WAIT on
    each node that got a publish."""
    url, _, _ = replicated
    flush(url)
    store = Store(connect(url), wait_replicas=1, wait_timeout=1000)
    topics = [f"w{i}" for i in range(10)]
    nodes = {store.redis.get_node_from_key(TopicKeys.of(t).ids).port for t in topics}
    assert len(nodes) == 3
    store.subscribe("other", "ch", "b")
    before = waits(url)
    ops = [store.publish_op(t, [b"x"]) for t in topics for _ in range(3)]
    results = store.run_many(ops + [store.subscribe_op("other", "ch2", "b")])
    assert not any(isinstance(r, Exception) for r in results), results
    after = waits(url)
    assert {port: after[port] - before[port] for port in after} == {port: 1 for port in nodes}


def test_a_burst_of_publishes_shares_waits(replicated, waiting_broker):
    url, _, _ = replicated
    before = sum(waits(url).values())
    wire = Wire(waiting_broker)
    wire.send(b"".join(b"PUB burst\n" + len(b"m").to_bytes(4, "big") + b"m"
                       for _ in range(200)))
    assert [wire.frame() for _ in range(200)] == [(0, b"OK")] * 200
    sent = sum(waits(url).values()) - before
    assert 1 <= sent <= 20, sent


@pytest.fixture
def no_replica(single_redis_url, tmp_path):
    """A broker on the single embedded Redis, which has no replica, with --wait-replicas 1."""
    flush(single_redis_url)
    procs = Processes(single_redis_url, str(tmp_path))
    _, port = procs.broker("--wait-replicas", "1", "--redis-timeout", "400ms")
    yield single_redis_url, port, procs.http_ports[port]
    procs.stop_all()


def test_without_the_replicas_a_publish_fails_after_the_timeout(no_replica):
    url, port, http_port = no_replica
    for command, body, code in (("PUB t", b"x", b"E_PUB_FAILED"),
                                ("MPUB t", None, b"E_MPUB_FAILED"),
                                ("DPUB t 10", b"x", b"E_DPUB_FAILED")):
        wire = Wire(port)
        started = time.monotonic()
        if body is None:
            frame = wire.mpub("t", [b"a", b"b"])
        else:
            frame = wire.command(command, body).frame()
        assert frame == (FRAME_ERROR, code + b" " + command.split()[0].encode()
                         + b" outcome unknown, it may have been published: 0 of 1 replicas "
                           b"confirmed the write within 200ms")
        assert time.monotonic() - started >= 0.2
    import urllib.request
    import urllib.error
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{http_port}/pub?topic=t", b"x", timeout=5)
    assert (refused.value.code, json.loads(refused.value.read()),
            refused.value.headers["X-Relay-Outcome"]) == (
        503, {"message": "outcome unknown, it may have been published: 0 of 1 replicas "
                         "confirmed the write within 200ms"}, "unknown")


def test_without_the_replicas_consuming_still_works(no_replica):
    url, port, _ = no_replica
    consumer = subscribed(port, "t", "ch", rdy=1)
    Store(connect(url)).publish("t", [b"put there without waiting"])
    _, _, msg_id, body = consumer.message()
    assert body == b"put there without waiting"
    consumer.command(f"FIN {msg_id.decode()}")
    assert consumer.nothing()
    assert redis.Redis.from_url(url).zcard(ChannelKeys.of("t", "ch").inflight) == 0


def test_without_the_replicas_the_spark_sink_and_a_redrive_job_fail(single_redis_url):
    """The other publishers wait as a broker does: the Spark sink with its wait_replicas
    option, and a redrive job with the wait relay-admin queued it with."""
    flush(single_redis_url)
    store = Store(connect(single_redis_url))
    store.subscribe("t", "c", "")
    store.subscribe("t.dead", "read", "")
    spark = pytest.importorskip("relay.spark")
    sink = spark.TopicWriter({"redis_url": single_redis_url, "topic": "t",
                              "wait_replicas": "1", "redis_timeout": "400"})
    with pytest.raises(StoreError, match="0 of 1 replicas confirmed the write within 200ms"):
        sink.write(iter([{"body": "x"}]))
    record = make_record(time.time_ns(), 2, b"0000000000000001", b"dead")
    store.publish("t.dead", [deadletter.envelope("t", "c", record)])
    client = store.redis
    waiting = operations.enqueue(client, "redrive", "t", "c", {"wait_replicas": 1, "wait_timeout": 200})
    work(client)
    assert waiting.get_status(refresh=True) == "failed"
    assert "0 of 1 replicas confirmed" in waiting.latest_result().exc_string
    alone = operations.enqueue(client, "redrive", "t", "c", Store(client).replication())
    work(client)
    assert (alone.get_status(refresh=True), alone.result["requeued"]) == ("finished", 1)
