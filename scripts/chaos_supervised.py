"""`scripts/chaos.py --cluster N --replicas R --supervised`: the cluster as a user runs
it, `relay redis --cluster N --replicas R`, whose supervisor starts a killed master
again once a replica has taken its slots. The harness only kills (-9, the pid from
INFO server) and watches: the failover as every survivor sees it, then the
supervisor's line saying the old master rejoined."""

import os
import signal
import subprocess
import sys
import time

import redis

from scripts.chaos import ReplicatedCluster


class SupervisedCluster(ReplicatedCluster):
    """ReplicatedCluster's kills, on the nodes of a `relay redis --cluster` process."""

    def __init__(self, masters: int, replicas: int, conf: str, workdir: str,
                 cut_replication: float = 0.0):
        super().__init__(masters, replicas, conf, workdir, cut_replication)
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
