"""A master killed with -9 under load on a cluster with replicas: with --wait-replicas 1
every acknowledged message is delivered, and the brokers and scanner follow the
promoted replica without a restart. Prints the failover window."""

import os
import signal
import threading
import time

import gnsq
import pytest
import redis
import rq

from relay import embedded
from relay.codec import FRAME_RESPONSE
from relay.errors import StoreConnectionError, StoreError
from relay.store import Store
from relay.store.connection import connect
from relay.store.keys import TopicKeys
from workers import operations
from workers.operations import QUEUE_KEY
from tests.helpers.gnsq_clients import addr, stop
from tests.helpers.processes import Processes
from tests.helpers.servers import wake_listeners
from tests.helpers.wait import wait_for, wait_until
from tests.helpers.wire import Wire
from workers.jobs import worker_connection

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

NO_PERSISTENCE = ("--save", "", "--appendonly", "no")


def busy_topic(url: str) -> str:
    """A topic on the master serving rq's slot: the jobs worker loses its node too."""
    cluster = connect(url)
    rq_node = cluster.get_node_from_key(QUEUE_KEY).name
    return next(t for t in (f"busy{i}" for i in range(100))
                if cluster.get_node_from_key(TopicKeys.of(t).ids).name == rq_node)


def calm_topic(url: str, busy_master: int) -> str:
    """A topic served by another master than the busy one."""
    cluster = connect(url)
    return next(t for t in (f"calm{i}" for i in range(100))
                if cluster.get_node_from_key(TopicKeys.of(t).ids).port != busy_master)


class Producer(threading.Thread):
    """PUB and MPUB (3 bodies) in turn over the wire; each acknowledged body is kept,
    a refused one is sent again (after 50 ms) until it is acknowledged. E_PUB_FAILED
    closes the connection, as nsqd's does: the producer connects again."""

    def __init__(self, port: int, topic: str, name: str):
        super().__init__(daemon=True)
        self.port, self.topic, self.name = port, topic, name
        self.running = True
        self.acked: list[tuple[float, float, bytes]] = []   # (sent, acknowledged, body)
        self.failed: list[tuple[float, bytes]] = []         # (when, error)

    def acked_since(self, when: float) -> list:
        """(sent, acknowledged, body) of the publishes sent after `when`."""
        return [a for a in self.acked if a[0] > when]

    def stop(self) -> None:
        self.running = False
        self.join(10)

    def run(self) -> None:
        wire, n = Wire(self.port), 0
        while self.running:
            bodies = [b"%s-%06d" % (self.name.encode(), n + i) for i in range(1 + 2 * (n % 2))]
            sent = time.monotonic()
            try:
                frame = wire.pub(self.topic, bodies[0]) if len(bodies) == 1 \
                    else wire.mpub(self.topic, bodies)
            except (OSError, EOFError) as e:
                frame = (None, repr(e).encode())
            if frame[0] != FRAME_RESPONSE and self.running:
                wire.close()
                wire = Wire(self.port)
            if frame == (FRAME_RESPONSE, b"OK"):
                self.acked.extend((sent, time.monotonic(), b) for b in bodies)
                n += len(bodies)
                time.sleep(0.01)
            else:
                self.failed.append((time.monotonic(), frame[1]))
                time.sleep(0.05)


def publishes(store: Store, topic: str, body: bytes) -> bool:
    try:
        store.publish(topic, [body])
        return True
    except StoreError:
        return False


def promoted(survivor: int, slot: int, dead: int, timeout: float) -> int:
    """The port of the replica serving `slot` in place of `dead`, once there is one."""
    port = wait_until(lambda: embedded.master_of(survivor, slot),
                      lambda port: port not in (None, dead), timeout, interval=0.05)
    if port in (None, dead):
        raise AssertionError(f"slot {slot} not failed over within {timeout}s")
    return port


def serving(ports: list, topic: str) -> list:
    """Publish on each broker, and read it all from a new channel on each, twice: the
    first deliveries are left to time out (--msg-timeout 3s) for the scanner to
    requeue. Each channel's (attempts, body), sorted."""
    consumers = [Wire(port) for port in ports]
    for port, consumer in zip(ports, consumers):
        assert consumer.sub(topic, f"after-{port}", rdy=2) == (FRAME_RESPONSE, b"OK")
    for port in ports:
        assert Wire(port).pub(topic, b"after-%d" % port) == (FRAME_RESPONSE, b"OK")
    seen = []
    for consumer in consumers:
        messages = [consumer.message() for _ in range(2 * len(ports))]
        for _, attempts, msg_id, _ in messages:
            if attempts == 2:
                consumer.command(b"FIN " + msg_id)
        consumer.close()
        seen.append(sorted((attempts, body) for _, attempts, _, body in messages))
    return seen


def test_a_master_killed_under_load_loses_no_acknowledged_message(replicated, tmp_path):
    """Two brokers (--wait-replicas 1) and a scanner; producers and consumers on a topic
    of the master killed and one of another. The killed master is started again once
    its replica took over, as a replica: with one replica per master the new master has
    none until then, and --wait-replicas 1 refuses its publishes meanwhile."""
    url, nodes, data = replicated
    busy = busy_topic(url)
    slot = connect(url).keyslot(TopicKeys.of(busy).ids)
    dead = embedded.master_of(next(iter(nodes)), slot)
    survivor = next(p for p in nodes if p != dead)
    calm = calm_topic(url, dead)
    url = f"redis://127.0.0.1:{survivor}/0"  # the first node may be the one killed
    processes = Processes(url, str(tmp_path))
    producers, consumers = [], []
    try:
        args = ("--wait-replicas", "1", "--redis-timeout", "2s", "--msg-timeout", "3s")
        ports = [processes.broker(*args)[1] for _ in range(2)]
        processes.scanner("--wait-replicas", "1")
        processes.jobs()
        received = set()
        consumers = [consuming(ports, topic, received) for topic in (busy, calm)]
        producers = [Producer(port, topic, f"{topic}-{i}")
                     for i, port in enumerate(ports) for topic in (busy, calm)]
        for p in producers:
            p.start()
        assert wait_for(lambda: len(received) >= 200, timeout=10)

        store = Store(connect(url), wait_replicas=1, wait_timeout=1000)
        store.run_many([store.publish_op(calm, [b"before"])])
        killed = time.monotonic()
        os.kill(nodes[dead].pid, signal.SIGKILL)
        busy_result, calm_result = store.run_many(
            [store.publish_op(busy, [b"lost"]), store.publish_op(calm, [b"sharing"])])
        assert isinstance(busy_result, StoreConnectionError)  # one pipeline, two nodes:
        assert not isinstance(calm_result, Exception)         # the dead one fails alone
        new_master = promoted(survivor, slot, dead, timeout=15)
        in_place = time.monotonic()
        nodes[dead] = embedded.restart_node(dead, data, NO_PERSISTENCE)
        assert wait_for(lambda: all(p.acked_since(in_place) for p in producers), timeout=10), \
            [(p.name, len(p.acked), p.failed[-1:]) for p in producers]
        # the Store made before the kill (as relay-admin's and the Spark connector's are
        # long-lived) follows the promoted replica too
        assert wait_for(lambda: publishes(store, busy, b"via-the-old-store"), timeout=10)
        wait_for(lambda: False, timeout=1.0)  # a second more of publishing, on the new master
        for p in producers:
            p.stop()

        acked = {body for p in producers for _, _, body in p.acked} | {b"via-the-old-store"}
        assert wait_for(lambda: acked <= received, timeout=15), \
            f"not delivered: {sorted(acked - received)[:10]} of {len(acked)}"
        report_window(killed, in_place, [p for p in producers if p.topic == busy],
                      [p for p in producers if p.topic != busy])
        for p in producers:  # refused during the window only, and on the slot killed only
            assert [when for when, _ in p.failed if when > p.acked_since(killed)[0][1]] == []
            assert p.topic == busy or p.failed == []
        assert [proc.poll() for proc in processes.procs] == [None] * 4  # none restarted
        published = [b"after-%d" % port for port in sorted(ports)]
        assert serving(ports, busy) == [sorted((a, body) for a in (1, 2) for body in published)
                                        ] * len(ports)
        wake = TopicKeys.of(busy).wake
        assert connect(url).get_node_from_key(wake).port == new_master
        assert wait_for(lambda: wake_listeners(url, busy) == 2, timeout=5), {
            port: redis.Redis(port=port).execute_command("PUBSUB", "SHARDNUMSUB", wake)[1]
            for port in nodes}
        assert job_done(url), processes.logs()
    finally:
        for p in producers:
            p.running = False
        stop(*consumers)
        processes.stop_all()
        print(processes.logs())  # shown if the test failed


def consuming(ports: list, topic: str, received: set) -> gnsq.Consumer:
    """A gnsq consumer of channel c on every broker, FINning each message it keeps."""
    consumer = gnsq.Consumer(topic, "c", [addr(p) for p in ports], max_in_flight=50)
    consumer.on_message.connect(lambda _, message: received.add(message.body), weak=False)
    consumer.start(block=False)
    return consumer


def job_done(url: str) -> bool:
    """Whether `relay jobs` runs a job enqueued now, within 15 s."""
    connection = worker_connection(connect(url))
    job = rq.Queue(operations.QUEUE, connection=connection).enqueue(len, "abc")
    return wait_for(lambda: job.get_status() == "finished", timeout=15, interval=0.2)


def report_window(killed: float, in_place: float, busy: list, calm: list) -> None:
    """Print the failover window: from the kill to the first acknowledged publish to the
    slot, the publishes refused meanwhile, and the slowest publish to the other topic."""
    first_ok = min(p.acked_since(killed)[0][1] for p in busy)
    refused = sum(len(p.failed) for p in busy)
    errors = sorted({error.decode() for p in busy for _, error in p.failed})
    slowest = max(done - sent for p in calm for sent, done, _ in p.acked_since(killed))
    print(f"\nfailover window: {first_ok - killed:.2f} s from kill -9 to the first "
          f"acknowledged publish to its slot ({in_place - killed:.2f} s to the replica's "
          f"promotion, then the old master restarted as its replica); {refused} publishes "
          f"refused meanwhile; slowest publish to another master's topic "
          f"{slowest * 1000:.0f} ms; errors: {errors}")


def test_the_jobs_worker_follows_the_promoted_replica(replicated, tmp_path):
    """rq's worker retries a dead node's address for ever: `relay jobs` starts it again
    where rq's slot went, although the old master is not back."""
    url, nodes, data = replicated
    dead = connect(url).get_node_from_key(QUEUE_KEY).port
    survivor = next(p for p in nodes if p != dead)
    url = f"redis://127.0.0.1:{survivor}/0"
    processes = Processes(url, str(tmp_path))
    try:
        worker = processes.jobs()
        assert wait_for(lambda: operations.has_worker(worker_connection(connect(url))), timeout=10)
        os.kill(nodes[dead].pid, signal.SIGKILL)
        promoted(survivor, connect(url).keyslot(QUEUE_KEY), dead, timeout=15)
        assert job_done(url), processes.logs()
        assert worker.poll() is None
    finally:
        processes.stop_all()
        nodes[dead] = embedded.restart_node(dead, data, NO_PERSISTENCE)
