"""The Redis a chaos run (scripts/chaos.py) kills: one embedded server, restarted at
once from its AOF; a local cluster with replicas whose killed master the harness
starts again once failed over; or (--supervised) the cluster as a user runs it,
`relay redis --cluster N --replicas R`, whose supervisor does that itself: the
harness only kills (-9, the pid from INFO server) and watches the failover as every
survivor sees it, then the supervisor's line saying the old master rejoined."""

import os
import random
import signal
import subprocess
import sys
import time

import redis

from relay import embedded
from relay.store.keys import TopicKeys


def redis_for(args, conf: str, workdir: str, topic: str):
    """The run's Redis, as its arguments ask (--cluster, --replicas, --supervised,
    --cut-replication)."""
    if not args.cluster:
        return SingleRedis(conf, workdir)
    kind = SupervisedCluster if args.supervised else ReplicatedCluster
    return kind(args.cluster, args.replicas, conf, workdir, args.cut_replication, topic)


def kill9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


class SingleRedis:
    """The embedded Redis, killed with -9 and started again at once from its AOF."""

    kind = "redis"

    def __init__(self, conf: str, workdir: str):
        self.conf, self.dir = conf, os.path.join(workdir, "redis")
        self.port = embedded.free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None

    def start(self) -> None:
        self.proc = embedded.start(self.port, self.dir, self.conf)

    def kill(self) -> dict:
        """Kill and restart: when (monotonic) and the seconds until it listens again."""
        killed = time.monotonic()
        kill9(self.proc)
        time.sleep(0.5)
        self.start()
        return {"at": killed, "restarted_s": round(time.monotonic() - killed, 2)}

    def processes(self) -> list:
        return [self.proc] if self.proc else []


class ReplicatedCluster:
    """A local cluster of `masters` masters with `replicas` replicas each
    (cluster-node-timeout 2 s). A kill takes one master down with -9, waits until a
    replica serves its slots, starts it again from its nodes.conf and waits until it is
    an attached replica: the next kill meets every master replicated again. Every other
    kill is the master serving the chaos topic, whose acknowledged messages a lost
    write would take; the others hit another master (registries, rq's keys)."""

    kind = "master"

    def __init__(self, masters: int, replicas: int, conf: str, workdir: str,
                 cut_replication: float = 0.0, topic: str = "chaos"):
        """`cut_replication`: seconds before each kill at which the master's replicas are
        cut off (see cut_off); 0: none. `topic`: the run's, whose master every other kill
        hits."""
        first = embedded.free_ports(masters * (1 + replicas))
        self.ports = list(range(first, first + masters * (1 + replicas)))
        self.replicas, self.conf, self.dir = replicas, conf, os.path.join(workdir, "cluster")
        self.cut_replication, self.topic = cut_replication, topic
        self.procs: dict[int, subprocess.Popen] = {}
        self.kills = 0

    def live_port(self) -> int:
        return next(p for p in self.ports if self.procs[p].poll() is None)

    @property
    def url(self) -> str:
        """A node that runs, for processes started now (a client seeded with a dead node
        would take the cluster for a single server)."""
        return f"redis://127.0.0.1:{self.live_port()}/0"

    def start(self) -> None:
        procs = embedded.start_cluster(self.ports, self.dir, conf=self.conf,
                                       replicas=self.replicas)
        self.procs = dict(zip(self.ports, procs))

    def kill(self) -> dict:
        """Kill a master, see its replica promoted and it back as a replica: which master
        (the topic's or another), when (monotonic) and the seconds to each step."""
        seen_by = self.live_port()
        slot = redis.Redis(port=seen_by).cluster("keyslot", TopicKeys.of(self.topic).ids)
        topic_master = embedded.master_of(seen_by, slot)
        others = [m for _, _, m in embedded.slot_masters(seen_by) if m != topic_master]
        victim = topic_master if self.kills % 2 == 0 else random.choice(others)
        self.kills += 1
        stopped = self.cut_off(victim) if self.cut_replication else []
        killed = time.monotonic()
        self.kill9(victim)
        for replica in stopped:
            os.kill(replica, signal.SIGCONT)
        embedded.wait_for_failover(self.ports, victim)
        promoted = time.monotonic()
        self.start_again(victim)
        embedded.wait_for_cluster([redis.Redis(port=p, socket_timeout=5) for p in self.ports],
                                  timeout=60, replicas=self.replicas)
        return {"master": "topic's" if victim == topic_master else "other", "at": killed,
                "promoted_s": round(promoted - killed, 2),
                "rejoined_s": round(time.monotonic() - killed, 2)}

    def pid(self, port: int) -> int:
        return self.procs[port].pid

    def kill9(self, port: int) -> None:
        kill9(self.procs[port])

    def start_again(self, port: int) -> None:
        """The killed master, once its replica serves its slots: from its nodes.conf it
        rejoins as that replica."""
        self.procs[port] = embedded.restart_node(port, self.dir, conf=self.conf)

    def cut_off(self, master: int) -> list:
        """Leave `master`'s replicas cut_replication seconds behind it, as a network
        partition would: each is stopped (SIGSTOP; a running one reconnects within a
        millisecond) and its link closed, so what the master acknowledges meanwhile is on
        no replica. Returns the pids stopped, for SIGCONT once the master is dead."""
        stopped = [self.pid(port) for port in self.ports if port != master and redis.Redis(
            port=port).info("replication").get("master_port") == master]
        for replica in stopped:
            os.kill(replica, signal.SIGSTOP)
        redis.Redis(port=master).execute_command("CLIENT", "KILL", "TYPE", "replica")
        time.sleep(self.cut_replication)
        return stopped

    def processes(self) -> list:
        return list(self.procs.values())



class SupervisedCluster(ReplicatedCluster):
    """ReplicatedCluster's kills, on the nodes of a `relay redis --cluster` process."""

    def __init__(self, masters: int, replicas: int, conf: str, workdir: str,
                 cut_replication: float = 0.0, topic: str = "chaos"):
        super().__init__(masters, replicas, conf, workdir, cut_replication, topic)
        self.masters = masters
        self.log_path = os.path.join(workdir, "cluster.log")
        self.proc: subprocess.Popen | None = None
        self.rejoins: dict[int, int] = {}

    def start(self) -> None:
        """`relay redis --cluster`, once it says the cluster is up."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "relay", "redis", "--cluster", str(self.masters),
                 "--replicas", str(self.replicas), "--redis-url",
                 f"redis://127.0.0.1:{self.ports[0]}/0", "--data-dir", self.dir,
                 "--redis-conf", self.conf], stdout=log, stderr=subprocess.STDOUT)
        self.wait_line("relay: Redis Cluster of", 1, timeout=60)

    def live_port(self) -> int:
        for port in self.ports:
            try:
                redis.Redis(port=port, socket_timeout=1).ping()
                return port
            except redis.RedisError:
                continue
        raise RuntimeError("no node of the cluster answers")

    def pid(self, port: int) -> int:
        return redis.Redis(port=port, socket_timeout=5).info("server")["process_id"]

    def kill9(self, port: int) -> None:
        os.kill(self.pid(port), signal.SIGKILL)

    def start_again(self, port: int) -> None:
        """Nothing to do but wait: the supervisor starts it again and says so."""
        self.rejoins[port] = self.rejoins.get(port, 0) + 1
        self.wait_line(f"node 127.0.0.1:{port} rejoined", self.rejoins[port], timeout=60)

    def wait_line(self, text: str, count: int, timeout: float) -> None:
        """Until the supervisor's output holds `text` on `count` lines."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.output()
            if sum(text in line for line in self.output().splitlines()) >= count:
                return
            time.sleep(0.05)
        raise TimeoutError(f"no {text!r} from `relay redis --cluster` after {timeout}s")

    def output(self) -> str:
        with open(self.log_path) as log:
            return log.read()

    def processes(self) -> list:
        return [self.proc] if self.proc else []
