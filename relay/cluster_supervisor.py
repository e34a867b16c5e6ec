"""`relay redis --cluster`: keep a local cluster's nodes running as a supervisor would.
A node that dies is started again while the others go on serving: a master with
replicas once a replica has taken over its slots (it rejoins as that replica, from its
nodes.conf), any other node at once (a master without replicas from its AOF). A node
that keeps dying is started again less and less often. One log line per event."""

import logging
import os
import signal
import subprocess
import time

import redis

from relay import embedded

log = logging.getLogger("relay.cluster")

TICK = 0.1              # s between looks at the nodes
FAILOVER_WAIT = 15.0    # s a dead master waits for a replica to take over its slots
QUICK_DEATH = 5.0       # s: a node dead this soon after its start is backed off
FIRST_BACKOFF = 1.0     # s before starting again a node that died quickly; doubled each
MAX_BACKOFF = 30.0      # time it dies quickly again, up to this
STOP_WAIT = 10.0        # s the nodes have to stop (SIGTERM, each second) before any left is killed

RUNNING, FAILING_OVER, WAITING, STARTING, REJOINING = (
    "running", "failing over", "waiting", "starting", "rejoining")


class Node:
    """One node's process and where it is between its death and its return."""

    def __init__(self, port: int, proc: subprocess.Popen, started: float):
        self.port, self.proc, self.started = port, proc, started
        self.state = RUNNING
        self.died = 0.0        # monotonic: when it was seen dead
        self.start_at = 0.0    # monotonic: not started again before (back off)
        self.backoff = 0.0     # s: the last back off, doubled if it dies quickly again
        self.slots: list = []  # the slot ranges it served when it died

    @property
    def name(self) -> str:
        return f"127.0.0.1:{self.port}"


class ClusterSupervisor:
    """Watches the nodes of a cluster started by embedded.start_cluster (same ports,
    data_dir, conf and replicas) and starts again those that die, until run's `stopping`
    is set (by a signal handler); then stop ends them all."""

    def __init__(self, ports: list, data_dir: str, conf: str | None, replicas: int,
                 procs: list, started: float, failover_wait: float = FAILOVER_WAIT):
        """`started`: when (monotonic) start_cluster began starting `procs`."""
        self.nodes = [Node(port, proc, started) for port, proc in zip(ports, procs)]
        self.data_dir, self.conf, self.replicas = data_dir, conf, replicas
        self.failover_wait = failover_wait
        self.node_timeout = (embedded.FAILOVER_NODE_TIMEOUT if replicas
                             else embedded.NODE_TIMEOUT)

    def run(self, stopping: list) -> None:
        """Until `stopping` holds something: each node one step further each tick."""
        self._warn_without_aof()
        steps = {RUNNING: self._watch, FAILING_OVER: self._await_failover,
                 WAITING: self._await_start, STARTING: self._await_listening,
                 REJOINING: self._await_rejoined}
        while not stopping:
            for node in self.nodes:
                if not stopping:
                    steps[node.state](node)
            time.sleep(TICK)

    def stop(self) -> None:
        """Every node stopped (embedded.stop_nodes); a line for one that had to be killed."""
        killed = embedded.stop_nodes([node.proc for node in self.nodes], STOP_WAIT)
        for node in self.nodes:
            if node.proc in killed:
                log.warning(f"node {node.name} did not stop within {STOP_WAIT:.0f} s: killed")

    def _warn_without_aof(self) -> None:
        """One line if the nodes keep no AOF: a node started again then comes back
        empty unless a replica of it lives."""
        try:
            aof = _client(self.nodes[0].port).config_get("appendonly").get("appendonly")
        except redis.RedisError:
            return
        if aof == "no":
            log.warning("the nodes keep no AOF (appendonly no: no --redis-conf, whose "
                        "default is conf/redis.conf from the current folder): a node "
                        "started again without a live replica comes back empty")

    # -- the steps, one per state -------------------------------------------------

    def _watch(self, node: Node) -> None:
        """A running node: has it died?"""
        if node.proc.poll() is None:
            return
        now = time.monotonic()
        node.died, node.slots = now, self._slots_of(node)
        node.backoff = (min(max(2 * node.backoff, FIRST_BACKOFF), MAX_BACKOFF)
                        if now - node.started < QUICK_DEATH else 0.0)
        node.start_at = now + node.backoff
        died = f"node {node.name} (pid {node.proc.pid}) died: {self._cause(node)}"
        if node.slots and self.replicas:
            node.state = FAILING_OVER
            log.warning(f"{died}; waiting for a replica to take over slots "
                        f"{_ranges(node.slots)}")
            return
        node.state = WAITING
        again = (f"starting it again in {node.backoff:.0f} s (it ran "
                 f"{now - node.started:.1f} s)" if node.backoff else "starting it again")
        log.warning(f"{died}; {again}")

    def _cause(self, node: Node) -> str:
        """Its exit status or signal, and where its log says why if nobody killed it."""
        code = node.proc.returncode
        cause = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        if -code in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            return cause
        log_file = os.path.join(self.data_dir, str(node.port), embedded.NODE_LOG)
        return f"{cause} (its log: {log_file})"

    def _await_failover(self, node: Node) -> None:
        """A dead master with replicas: started again once a replica serves its slots
        (it then rejoins as its replica), or after failover_wait anyway."""
        if self._failed_over(node):
            successor = self._master_of(node.slots[0][0])
            log.info(f"failover: {successor or 'a replica'} serves slots "
                     f"{_ranges(node.slots)} in place of {node.name}, "
                     f"{time.monotonic() - node.died:.1f} s after it died")
        elif time.monotonic() - node.died > self.failover_wait:
            log.warning(f"no failover of {node.name} within {self.failover_wait:.0f} s "
                        "(no live replica?): starting it again as the master of its slots")
        else:
            return
        node.state = WAITING

    def _await_start(self, node: Node) -> None:
        """A dead node whose back off is over: start it again from its data folder."""
        if time.monotonic() < node.start_at:
            return
        try:
            node.proc, _ = embedded.spawn_cluster_node(
                node.port, self.data_dir, conf=self.conf, node_timeout=self.node_timeout)
        except embedded.NodeFailed as e:  # its port or bus port taken meanwhile
            node.backoff = min(max(2 * node.backoff, FIRST_BACKOFF), MAX_BACKOFF)
            node.start_at = time.monotonic() + node.backoff
            log.warning(f"{e}; trying again in {node.backoff:.0f} s")
            return
        node.started, node.state = time.monotonic(), STARTING

    def _await_listening(self, node: Node) -> None:
        """A node started again: once it listens, say so; if it died, back to _watch's
        reckoning (with its back off)."""
        if node.proc.poll() is not None:
            self._watch(node)
        elif embedded.listens("127.0.0.1", node.port):
            log.info(f"node {node.name} started again (pid {node.proc.pid})")
            node.state = REJOINING

    def _await_rejoined(self, node: Node) -> None:
        """A node back on its port: once it is an attached replica, or a master the
        cluster sees ok, say what it is now."""
        if node.proc.poll() is not None:
            self._watch(node)
            return
        try:
            rejoined = _rejoined_as(node.port)
        except redis.RedisError:
            return  # loading its AOF, or not yet known to its peers: ask again
        if rejoined:
            log.info(f"node {node.name} {rejoined}, "
                     f"{time.monotonic() - node.died:.1f} s after it died")
            node.state = RUNNING

    # -- what the live nodes see --------------------------------------------------

    def _live(self) -> list:
        return [n.port for n in self.nodes if n.state == RUNNING and n.proc.poll() is None]

    def _slots_of(self, dead: Node) -> list:
        """The slot ranges the dead node served, as the first live node that answers
        sees them ([] if it was a replica, or none answers)."""
        for port in self._live():
            try:
                return _slots_in(_client(port).cluster("nodes"), dead.port)
            except redis.RedisError:
                continue
        return []

    def _failed_over(self, dead: Node) -> bool:
        """Whether every live node sees all slots served, by other masters than `dead`."""
        live = self._live()
        try:
            return bool(live) and all(embedded.served_without(p, dead.port) for p in live)
        except redis.RedisError:
            return False

    def _master_of(self, slot: int) -> str | None:
        for port in self._live():
            try:
                master = embedded.master_of(port, slot)
                return f"127.0.0.1:{master}" if master else None
            except redis.RedisError:
                continue
        return None


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=1)


def _rejoined_as(port: int) -> str | None:
    """What a node started again has become, in words, once it has: a replica whose
    link to its master is up, or a master in a cluster it sees ok. None until then."""
    node = _client(port)
    replication = node.info("replication")
    if replication["role"] == "slave":
        if replication.get("master_link_status") != "up":
            return None
        return (f"rejoined as a replica of {replication['master_host']}:"
                f"{replication['master_port']}")
    if node.cluster("info")["cluster_state"] != "ok":
        return None
    slots = _slots_in(node.cluster("nodes"), port)
    if not slots:
        return "rejoined as a master without slots"
    return f"serves slots {_ranges(slots)} again, keys loaded: {node.dbsize()}"


def _slots_in(nodes: dict, port: int) -> list:
    """The slot ranges of the master on `port` in a CLUSTER NODES reply (redis-py's:
    address -> fields), [] for a replica or a node not in it."""
    for address, fields in nodes.items():
        if address.split("@")[0].endswith(f":{port}") and "master" in fields["flags"]:
            return [(int(r[0]), int(r[-1])) for r in fields["slots"]]
    return []


def _ranges(slots: list) -> str:
    return ", ".join(f"{first}-{last}" if last != first else str(first)
                     for first, last in slots)
