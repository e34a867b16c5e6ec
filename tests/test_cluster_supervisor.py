"""`relay redis --cluster N [--replicas R]` run as the README has users run it, with a
master killed -9: the other nodes keep answering, the supervisor starts the dead one
again (with replicas once one has taken its slots, and it rejoins as that replica;
without, at once from its AOF), says so one line per event, backs off a node that
keeps dying, and SIGTERM stops every node."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from relay import embedded
from relay.cluster_supervisor import QUICK_DEATH, ClusterSupervisor
from relay.embedded import BUS_OFFSET
from relay.codec import FRAME_RESPONSE
from relay.store.keys import TopicKeys
from tests.helpers.processes import Processes
from tests.helpers.wait import wait_for, wait_until
from tests.helpers.wire import Wire
from tests.test_failover import Producer

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURE = r"[\d.]+"


class Cluster:
    """`relay redis --cluster` as a process, from the checkout (so its nodes get
    conf/redis.conf, as a user's do), its output in a file."""

    def __init__(self, tmp_path, masters: int, replicas: int, hold_bus: int | None = None):
        """`hold_bus`: the index of a node whose port + 10000 something else listens on
        from before the start (self.held, closed by stop)."""
        first = embedded.free_ports(masters * (1 + replicas))
        self.ports = list(range(first, first + masters * (1 + replicas)))
        self.held = None if hold_bus is None else listening(self.ports[hold_bus] + BUS_OFFSET)
        self.data = tmp_path / "data"
        self.log = open(tmp_path / "cluster.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "relay", "redis", "--cluster", str(masters), "--replicas",
             str(replicas), "--redis-url", f"redis://127.0.0.1:{first}/0",
             "--data-dir", str(self.data)],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_line("relay: Redis Cluster of", timeout=60)

    def events(self) -> list:
        """The supervisor's log messages so far (logger relay.cluster)."""
        self.log.seek(0)
        return [re.search(r'msg="(.*)"$', line.strip()).group(1)
                for line in self.log if "logger=relay.cluster" in line]

    def wait_line(self, text: str, timeout: float = 30.0, count: int = 1) -> str:
        """The count-th line of the output holding `text`, once it is written."""
        def found():
            self.log.seek(0)
            lines = [line.strip() for line in self.log if text in line]
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.output()}"
            return lines[count - 1] if len(lines) >= count else None
        line = wait_until(found, lambda line: line is not None, timeout, interval=0.05)
        assert line is not None, f"no {text!r} after {timeout}s:\n{self.output()}"
        return line

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            self.log.close()
            if self.held:
                self.held.close()


def listening(port: int) -> socket.socket:
    held = socket.socket()
    held.bind(("127.0.0.1", port))
    held.listen()
    return held


def bus_ports(port: int) -> dict:
    """Each node's cluster bus port, as the node on `port` knows it."""
    client = redis.Redis(port=port, decode_responses=True)
    client.set_response_callback("CLUSTER NODES", lambda reply, **_: reply)  # cports kept
    found = (re.search(r":(\d+)@(\d+)", line) for line in client.cluster("nodes").splitlines())
    return {int(m.group(1)): int(m.group(2)) for m in found}


def pid(port: int) -> int:
    return redis.Redis(port=port).info("server")["process_id"]


def slots_of(port: int) -> str:
    """The slot ranges of the master on `port`, as the supervisor writes them."""
    fields = next(f for address, f in redis.Redis(port=port).cluster("nodes").items()
                  if "myself" in f["flags"])
    return ", ".join(f"{r[0]}-{r[-1]}" for r in fields["slots"])


def gone(pids: list) -> bool:
    """Whether none of these processes exists any more."""
    def exists(p):
        try:
            os.kill(p, 0)
            return True
        except ProcessLookupError:
            return False
    return not any(exists(p) for p in pids)


class Pinger(threading.Thread):
    """PING each node on `ports` every 50 ms until stopped; the failures, (port, error)."""

    def __init__(self, ports: list):
        super().__init__(daemon=True)
        self.clients = {p: redis.Redis(port=p, socket_timeout=1) for p in ports}
        self.failures: list = []
        self.pings = 0
        self.running = True

    def run(self) -> None:
        while self.running:
            for port, client in self.clients.items():
                try:
                    client.ping()
                    self.pings += 1
                except redis.RedisError as e:
                    self.failures.append((port, repr(e)))
            time.sleep(0.05)

    def stop(self) -> list:
        self.running = False
        self.join(5)
        return self.failures


def delivered(port: int, topic: str, channel: str, wanted: set) -> set:
    """The bodies read (and FINned) from the channel until `wanted` are all there, or
    nothing came for 5 s."""
    wire, got = Wire(port), set()
    assert wire.sub(topic, channel, rdy=500) == (FRAME_RESPONSE, b"OK")
    try:
        while not wanted <= got:
            _, _, msg_id, body = wire.message()
            got.add(body)
            wire.command(b"FIN " + msg_id)
    except OSError:
        pass  # a timeout: nothing more comes
    wire.close()
    return got


def test_a_master_killed_is_failed_over_and_rejoins_as_its_successors_replica(tmp_path):
    """A broker with --wait-replicas 1 and a producer on the killed master's topic run
    through it: every acknowledged message is delivered."""
    cluster = Cluster(tmp_path, masters=3, replicas=1)
    processes, producer = None, None
    try:
        assert [redis.Redis(port=p).config_get("appendonly") for p in cluster.ports] == [
            {"appendonly": "yes"}] * 6
        first = cluster.ports[0]
        dead = embedded.master_of(first, redis.Redis(port=first).cluster(
            "keyslot", TopicKeys.of("watched").ids))
        successor = next(p for p in cluster.ports
                         if redis.Redis(port=p).info("replication").get("master_port") == dead)
        others = [p for p in cluster.ports if p != dead]
        slots, pids = slots_of(dead), {p: pid(p) for p in cluster.ports}
        processes = Processes(f"redis://127.0.0.1:{successor}/0", str(tmp_path))
        _, broker = processes.broker("--wait-replicas", "1", "--redis-timeout", "2s")
        Wire(broker).sub("watched", "held")  # the channel, before the first message
        producer = Producer(broker, "watched", "p")
        producer.start()
        assert wait_for(lambda: len(producer.acked) >= 50, timeout=10)

        pinger = Pinger(others)
        pinger.start()
        killed = time.monotonic()
        os.kill(pids[dead], signal.SIGKILL)
        cluster.wait_line(f"node 127.0.0.1:{dead} rejoined")
        rejoined = time.monotonic()
        assert wait_for(lambda: len(producer.acked_since(rejoined)) >= 50, timeout=15)
        producer.stop()
        assert pinger.stop() == [] and pinger.pings > 0

        restarted = pid(dead)
        assert cluster.events() == [
            f"node 127.0.0.1:{dead} (pid {pids[dead]}) died: killed by SIGKILL; waiting for "
            f"a replica to take over slots {slots}",
            *matching(cluster.events()[1:2],
                      rf"failover: 127\.0\.0\.1:{successor} serves slots {slots} in place "
                      rf"of 127\.0\.0\.1:{dead}, {FIGURE} s after it died"),
            f"node 127.0.0.1:{dead} started again (pid {restarted})",
            *matching(cluster.events()[3:4],
                      rf"node 127\.0\.0\.1:{dead} rejoined as a replica of "
                      rf"127\.0\.0\.1:{successor}, {FIGURE} s after it died")]
        nodes = redis.Redis(port=others[0]).cluster("nodes")
        by_port = {address.split("@")[0]: f for address, f in nodes.items()}
        assert by_port[f"127.0.0.1:{dead}"]["master_id"] == by_port[
            f"127.0.0.1:{successor}"]["node_id"]
        assert "slave" in by_port[f"127.0.0.1:{dead}"]["flags"]
        assert {p: pid(p) for p in others} == {p: pids[p] for p in others}

        acked = {body for _, _, body in producer.acked}
        assert acked - delivered(broker, "watched", "held", acked) == set()
        report(killed, rejoined, producer)
        live = [pid(p) for p in cluster.ports]
    finally:
        if producer is not None:
            producer.running = False
        if processes is not None:
            processes.stop_all()
        status = cluster.stop()
    assert status == 0
    assert gone(live)


def matching(messages: list, pattern: str) -> list:
    """`messages` if each matches `pattern` whole, else the pattern (so a failed
    comparison shows both)."""
    return messages if messages and all(re.fullmatch(pattern, m) for m in messages) \
        else [pattern]


def report(killed: float, rejoined: float, producer: Producer) -> None:
    """The run's figures, printed (RELIABILITY.md quotes a run of them)."""
    acks = sorted(done for _, done, _ in producer.acked)
    gap = max(b - a for a, b in zip(acks, acks[1:]))
    print(f"\nacknowledged {len(acks)}, lost 0, publish gap {gap:.2f} s, old master "
          f"rejoined {rejoined - killed:.2f} s after kill -9, {len(producer.failed)} "
          f"publishes refused meanwhile")


def test_a_master_without_replicas_comes_back_from_its_aof_and_one_that_keeps_dying_is_backed_off(
        tmp_path):
    """The master killed had its port + 10000 taken before the cluster started: its bus
    is on a port below the kernel's ephemeral range, where it comes back."""
    killed = key_slot(b"acknowledged") * 3 // embedded.SLOTS   # the master that serves it
    cluster = Cluster(tmp_path, masters=3, replicas=0, hold_bus=killed)
    try:
        client = RedisCluster(host="127.0.0.1", port=cluster.ports[0])
        client.set("acknowledged", "before the kill")
        dead = client.get_node_from_key("acknowledged").port
        assert dead == cluster.ports[killed]
        buses = bus_ports(cluster.ports[0])
        assert buses[dead] != dead + BUS_OFFSET
        assert buses[dead] < embedded.ephemeral_ports().start
        assert [buses[p] for p in cluster.ports if p != dead] == [
            p + BUS_OFFSET for p in cluster.ports if p != dead]
        node = redis.Redis(port=dead)
        assert node.execute_command("WAITAOF", 1, 0, 1000) == [1, 0]  # fsynced
        slots, before = slots_of(dead), pid(dead)
        pinger = Pinger([p for p in cluster.ports if p != dead])
        pinger.start()
        os.kill(before, signal.SIGKILL)
        cluster.wait_line(f"node 127.0.0.1:{dead} serves slots")
        back = time.monotonic()
        assert pinger.stop() == [] and pinger.pings > 0
        events = cluster.events()
        assert events == [
            *matching(events[:1], rf"node 127\.0\.0\.1:{dead} \(pid {before}\) died: killed by "
                                  rf"SIGKILL; starting it again( in 1 s \(it ran {FIGURE} s\))?"),
            f"node 127.0.0.1:{dead} started again (pid {pid(dead)})",
            *matching(events[2:3], rf"node 127\.0\.0\.1:{dead} serves slots {slots} again, "
                                   rf"keys loaded: 1, {FIGURE} s after it died")]
        assert RedisCluster(host="127.0.0.1", port=cluster.ports[0]).get(
            "acknowledged") == b"before the kill"
        assert bus_ports(cluster.ports[0]) == buses

        time.sleep(max(0.0, QUICK_DEATH - (time.monotonic() - back)))  # not dying quickly
        assert dying_thrice(cluster, dead) == ["killed by SIGKILL; starting it again"] + [
            f"killed by SIGSEGV (its log: {cluster.data / str(dead) / 'node.log'}); "
            f"starting it again in {backoff} s" for backoff in (1, 2)]
        cluster.wait_line(f"node 127.0.0.1:{dead} serves slots", count=2, timeout=30)
        assert RedisCluster(host="127.0.0.1", port=cluster.ports[0]).get(
            "acknowledged") == b"before the kill"
        live = [pid(p) for p in cluster.ports]
    finally:
        status = cluster.stop()
    assert status == 0
    assert gone(live)


def dying_thrice(cluster: Cluster, port: int) -> list:
    """Corrupt the node's nodes.conf and kill it: started again, it dies at once, twice;
    then put nodes.conf back. Why each of those three deaths was, and when the node is
    started again (the end of each death's line, but how long it ran)."""
    nodes_conf = cluster.data / str(port) / "nodes.conf"
    kept = nodes_conf.read_text()
    nodes_conf.write_text("not a cluster config\n")
    seen = len(cluster.events())
    os.kill(pid(port), signal.SIGKILL)
    cluster.wait_line(f"(its log: {cluster.data / str(port) / 'node.log'})", count=2)
    nodes_conf.write_text(kept)
    assert "corrupted cluster config file" in (cluster.data / str(port) / "node.log").read_text()
    died = rf"node 127\.0\.0\.1:{port} \(pid \d+\) died: (.*?)( \(it ran {FIGURE} s\))?"
    return [re.fullmatch(died, e).group(1) for e in cluster.events()[seen:]]


def test_a_master_whose_replica_cannot_take_over_is_started_again_after_the_bound(
        tmp_path, caplog):
    """Its replica stopped (SIGSTOP), a killed master gets no failover: the supervisor
    (in this process, with a 3 s bound) starts it again as the master of its slots."""
    first = embedded.free_ports(6)
    ports = list(range(first, first + 6))
    conf = os.path.join(ROOT, "conf", "redis.conf")
    procs = embedded.start_cluster(ports, str(tmp_path), conf=conf, replicas=1)
    supervisor = ClusterSupervisor(ports, str(tmp_path), conf, 1, procs, time.monotonic(),
                                   failover_wait=3.0)
    stopping: list = []
    watching = threading.Thread(target=supervisor.run, args=(stopping,), daemon=True)
    dead, replica = ports[0], ports[3]   # master 0's replica is the first after the masters
    caplog.set_level("INFO", logger="relay.cluster")
    try:
        watching.start()
        redis.Redis(port=dead).set("kept", "yes")  # slot 284: master 0 serves 0-5460
        slots, before = slots_of(dead), pid(dead)
        os.kill(pid(replica), signal.SIGSTOP)
        os.kill(before, signal.SIGKILL)
        assert wait_for(lambda: len(caplog.messages) >= 4, timeout=30), caplog.messages
        assert caplog.messages[:2] == [
            f"node 127.0.0.1:{dead} (pid {before}) died: killed by SIGKILL; waiting for a "
            f"replica to take over slots {slots}",
            f"no failover of 127.0.0.1:{dead} within 3 s (no live replica?): starting it "
            "again as the master of its slots"]
        assert caplog.messages[2] == f"node 127.0.0.1:{dead} started again (pid {pid(dead)})"
        assert re.fullmatch(rf"node 127\.0\.0\.1:{dead} serves slots {slots} again, keys "
                            rf"loaded: 1, {FIGURE} s after it died", caplog.messages[3])
        assert redis.Redis(port=dead).get("kept") == b"yes"
    finally:
        os.kill(procs[3].pid, signal.SIGCONT)  # it then syncs: a node writing its first
        stopping.append(True)                  # AOF refuses one SIGTERM
        watching.join(5)
        supervisor.stop()
    assert [node.proc.returncode for node in supervisor.nodes] == [0] * 6  # none killed


def test_sigterm_while_the_cluster_forms_stops_the_nodes_started_so_far(tmp_path):
    """As a Procfile's stop may come: no node outlives `relay redis --cluster`."""
    first = embedded.free_ports(6)
    proc = subprocess.Popen(
        [sys.executable, "-m", "relay", "redis", "--cluster", "3", "--replicas", "1",
         "--redis-url", f"redis://127.0.0.1:{first}/0", "--data-dir", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    embedded.wait_for_port("127.0.0.1", first, proc, timeout=30)
    node = pid(first)
    proc.send_signal(signal.SIGTERM)
    assert proc.communicate(timeout=30) == ("", None)  # before the cluster's line
    assert proc.returncode == 0
    assert gone([node])
    assert [port for port in range(first, first + 6) if embedded.listens("127.0.0.1", port)] == []


def test_a_stop_just_after_a_node_is_spawned_still_stops_it(tmp_path, monkeypatch):
    """SIGTERM the instant a node's process exists, before start_cluster has it in its
    list: the stop waits for the list (stops_held), and no node outlives the call."""
    spawn, spawned = embedded.spawn_cluster_node, []

    def spawn_then_stop(*args, **kwargs):
        proc, bus = spawn(*args, **kwargs)
        spawned.append(proc)
        os.kill(os.getpid(), signal.SIGTERM)   # its handler runs before this returns
        return proc, bus

    def exit_on_stop(*_):
        sys.exit(0)
    monkeypatch.setattr(embedded, "spawn_cluster_node", spawn_then_stop)
    before = signal.signal(signal.SIGTERM, exit_on_stop)
    first = embedded.free_ports(3)
    try:
        with pytest.raises(SystemExit):
            embedded.start_cluster([first, first + 1, first + 2], str(tmp_path))
    finally:
        signal.signal(signal.SIGTERM, before)
        for proc in spawned:
            left_running = proc.poll() is None
            proc.kill()
            proc.wait()
            assert not left_running
    assert len(spawned) == 1


def test_a_node_whose_port_is_taken_stops_the_cluster_with_one_line(tmp_path):
    """Something listens on the second node's port: `relay redis --cluster` says which
    node and port in one line, exits 1, and the first node does not outlive it."""
    first = embedded.free_ports(3)
    held = listening(first + 1)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "relay", "redis", "--cluster", "3", "--redis-url",
             f"redis://127.0.0.1:{first}/0", "--data-dir", str(tmp_path)],
            cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        held.close()
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        1, "", f"relay: node 127.0.0.1:{first + 1}: its port {first + 1} is taken\n")
    assert not embedded.listens("127.0.0.1", first)


def test_a_node_that_cannot_bind_its_bus_says_why_from_its_log(tmp_path, monkeypatch):
    """The bus port taken between the choice and the node's bind: the error names the
    node, the port and the line of its log that says why."""
    port, bus = embedded.free_ports(1), embedded.free_ports(1)
    monkeypatch.setattr(embedded, "bus_port", lambda *_: bus)
    with listening(bus), pytest.raises(embedded.NodeFailed) as failed:
        embedded.start_cluster([port], str(tmp_path))
    assert str(failed.value) == (f"node 127.0.0.1:{port} (cluster bus port {bus}) exited with "
                                 f"1: Failed listening on port {bus} (cluster), aborting.")


