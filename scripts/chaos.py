"""Chaos: publish numbered messages through brokers, scanners and a Redis that are
killed (-9) and restarted while producers and consumers run, then check that every
acknowledged message was delivered. Prints one JSON report. Every third kill is
Redis's, up to --redis-kills; the others are a random broker or scanner.

    chaos.py --messages 20000 --brokers 2 --scanners 2 --appendfsync always
    chaos.py --cluster 3 --replicas 1 --wait-replicas 1 --master-kills 5 ...

With --cluster, Redis is a local cluster with replicas (Valkey, as `relay redis
--cluster`), brokers and scanners run with --wait-replicas, and a Redis kill is a
master's: one at a time, the master serving the chaos topic every other time, each
waited through its failover and its return as a replica (scripts/chaos_redis.py).
--cut-replication S leaves the replica S seconds behind its master before the kill.
--supervised runs the cluster as `relay redis --cluster` instead, whose supervisor
starts the killed master again.

Producers MPUB batches to a random live broker and record a batch as acknowledged
only on OK; on an error or a lost connection they retry it elsewhere (so a batch
may be published twice: duplicates are counted, never lost). Consumers on every
broker FIN each message and reconnect when their broker dies; the messages a dead
broker held in flight come back after --msg-timeout, from a scanner. Every message
goes to two channels: `c` is consumed through the kills, `held` only once publishing
is over, so on `held` every acknowledged message must have outlived every kill in
Redis (on `c`, one delivered before a failover lost it would not show). A Redis kill -9
loses nothing acknowledged with either appendfsync setting (Redis write()s the AOF
before it replies; the kernel keeps it); everysec can lose the last second only
when the machine itself goes down, which this harness does not do. A master's kill
-9 loses what its replica had not received when it died: --wait-replicas 1 makes
brokers acknowledge a publish only once the replica holds it.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

from relay import embedded
from relay.store import Store
from relay.store.connection import connect
from scripts.chaos_redis import kill9, redis_for
from scripts.loadgen import Conn, identify_command, mpub_command, pub_command

TOPIC = "chaos"
LIVE, HELD = "c", "held"  # channels read while the kills go on, and once publishing is over
HEARTBEAT_MS = 1000    # consumers' heartbeat interval: a silent broker is dropped after 2 s
IDENTIFY = identify_command({"heartbeat_interval": HEARTBEAT_MS})
# for an ordered channel, where a key's next message goes out only once its last is
# finished: each message written at once, not within nsqd's 250 ms output buffer
IDENTIFY_UNBUFFERED = identify_command({"heartbeat_interval": HEARTBEAT_MS,
                                        "output_buffer_timeout": -1})
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def redis_conf(workdir: str, appendfsync: str) -> str:
    """conf/redis.conf (AOF) with this run's appendfsync, written into workdir."""
    conf = os.path.join(workdir, "redis.conf")
    with open(os.path.join(HERE, "conf", "redis.conf")) as f:
        text = f.read().replace("appendfsync everysec", f"appendfsync {appendfsync}")
    with open(conf, "w") as f:
        f.write(text)
    return conf


class System:
    """Redis (one server or a replicated cluster), brokers on fixed ports, and scanners,
    each killable and restartable."""

    host = "127.0.0.1"     # where the clients find the brokers

    def __init__(self, args, workdir):
        self.args = args
        self.workdir = workdir
        conf = redis_conf(workdir, args.appendfsync)
        self.redis = redis_for(args, conf, workdir, TOPIC)
        self.broker_ports = [embedded.free_port() for _ in range(args.brokers)]
        self.brokers: dict[int, subprocess.Popen] = {}
        self.scanners: list[subprocess.Popen] = []

    def _relay(self, *argv, log):
        env = {**os.environ, "REDIS_URL": self.redis.url, "RELAY_LOG_LEVEL": "warning"}
        out = open(os.path.join(self.workdir, log), "ab")
        return subprocess.Popen([sys.executable, "-m", "relay", *argv], env=env, cwd=self.workdir,
                                stdout=out, stderr=subprocess.STDOUT)

    def start_broker(self, port):
        proc = self._relay("broker", "--tcp-address", f"127.0.0.1:{port}", "--http-address", "",
                           "--lookupd-http-address", "", "--msg-timeout",
                           self.args.msg_timeout, "--wait-replicas", str(self.args.wait_replicas),
                           log=f"broker-{port}.log")
        embedded.wait_for_port("127.0.0.1", port, proc, timeout=30)
        self.brokers[port] = proc

    def start_scanner(self):
        return self._relay("scanner", "--wait-replicas", str(self.args.wait_replicas),
                           log="scanners.log")

    def start(self):
        self.redis.start()
        for port in self.broker_ports:
            self.start_broker(port)
        self.scanners = [self.start_scanner() for _ in range(self.args.scanners)]

    def kill_broker(self):
        port = random.choice(self.broker_ports)
        kill9(self.brokers[port])
        time.sleep(0.2)
        self.start_broker(port)
        return "broker"

    def kill_scanner(self):
        i = random.randrange(len(self.scanners))
        kill9(self.scanners[i])
        self.scanners[i] = self.start_scanner()
        return "scanner"

    def stop(self):
        """Brokers and scanners first, so they leave their registries while Redis runs."""
        stop_in_turn([*self.brokers.values(), *self.scanners], self.redis.processes())


def stop_in_turn(*groups: list) -> None:
    """Each group of processes sent SIGTERM and waited for (killed after 10 s), one group
    after the other."""
    for group in groups:
        for proc in group:
            proc.terminate()
        for proc in group:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.acked: set[bytes] = set()
        self.acked_at: list[tuple] = []  # (sent, acknowledged) of each batch, monotonic
        self.received: dict[str, Counter] = {LIVE: Counter(), HELD: Counter()}
        self.publish_retries = 0
        self.refused: list[tuple] = []       # (sent, refused, error) of each failed attempt
        self.delivered_at: list[tuple] = []  # (when, broker port) of each read with messages
        self.reconnects = 0


def produce(system, tally, index, count, batch, rate, stop, waits=None):
    """Publish `count` numbered messages in batches (PUB when `batch` is 1), each until it
    is acknowledged; every refusal or lost connection is noted with its duration. Given
    `waits`, each batch's seconds from its first try to its OK go there."""
    conn = None
    pause = batch / rate if rate else 0
    for start in range(0, count, batch):
        chunk = [b"%d:%d" % (index, n) for n in range(start, min(start + batch, count))]
        command = (pub_command(TOPIC.encode(), chunk[0]) if batch == 1
                   else mpub_command(TOPIC.encode(), chunk))
        first = time.monotonic()
        while not stop.is_set():
            sent = time.monotonic()
            try:
                if conn is None:
                    conn = Conn(system.host, random.choice(system.broker_ports), 2)
                conn.sock.settimeout(10)
                conn.sock.sendall(command)
                conn.expect_ok()
                with tally.lock:
                    tally.acked.update(chunk)
                    tally.acked_at.append((sent, time.monotonic()))
                if waits is not None:
                    waits.append(time.monotonic() - first)
                break
            except (OSError, EOFError, RuntimeError) as e:
                with tally.lock:
                    tally.publish_retries += 1
                    tally.refused.append((sent, time.monotonic(), str(e) or repr(e)))
                if conn is not None:
                    conn.sock.close()
                conn = None
                time.sleep(0.05)
        if stop.is_set():
            break
        time.sleep(pause)
    if conn is not None:
        conn.sock.close()


def consume(system, tally, channel, stop, rdy, port=None, identify=IDENTIFY):
    """SUB on `port` or a random broker, FIN everything; reconnect when the broker goes
    away or falls silent for HEARTBEAT_MS twice over (a partition closes nothing)."""
    while not stop.is_set():
        try:
            target = port or random.choice(system.broker_ports)
            conn = Conn(system.host, target, 2)
            conn.sock.settimeout(1.0)
            conn.sock.sendall(identify + f"SUB {TOPIC} {channel}\n".encode())
            conn.expect_ok(2)
            conn.sock.sendall(b"RDY %d\n" % rdy)
            heard = time.monotonic()
            while not stop.is_set():
                try:
                    frames = list(conn.frames())
                except TimeoutError:
                    if time.monotonic() - heard > 2 * HEARTBEAT_MS / 1000:
                        raise
                    continue
                heard = time.monotonic()
                fins = []
                for kind, data in frames:
                    if kind == 2:
                        fins.append(b"FIN " + data[10:26] + b"\n")
                        with tally.lock:
                            tally.received[channel][data[26:]] += 1
                    elif data == b"_heartbeat_":
                        fins.append(b"NOP\n")
                if fins:
                    conn.sock.sendall(b"".join(fins))
                    with tally.lock:
                        tally.delivered_at.append((heard, target))
        except (OSError, EOFError, RuntimeError):
            with tally.lock:
                tally.reconnects += 1
            time.sleep(0.1)


def timed(kill: dict, started: float, acked_at: list) -> dict:
    """A Redis kill's figures, with its time from the start of the run and the seconds
    from it to the first acknowledgement of a publish sent after it (None: none was)."""
    at = kill.pop("at")
    after = [acked for sent, acked in acked_at if sent >= at]
    stall = round(min(after) - at, 2) if after else None
    return {"at_s": round(at - started, 1), **kill, "next_publish_s": stall}


def create_channel(system, channel: str) -> None:
    """A channel that keeps every message published from now on, with no consumer yet
    (a channel gets only what is published after its first SUB, as in nsqd)."""
    conn = Conn(system.host, system.broker_ports[0])
    conn.sock.sendall(f"SUB {TOPIC} {channel}\n".encode())
    conn.expect_ok()
    conn.sock.close()


def consumers(system, tally, channel, stop, args, identify=IDENTIFY) -> list:
    threads = [threading.Thread(target=consume, daemon=True,
                                args=(system, tally, channel, stop, args.rdy, None, identify))
               for _ in range(args.consumers)]
    for t in threads:
        t.start()
    return threads


def kill_while_publishing(system, args, producers) -> tuple[list, list]:
    """A kill every --kill-interval until the producers are done: Redis every third
    time (up to --redis-kills), else a random broker or scanner. The kinds killed, and
    each Redis kill's figures."""
    kills, redis_kills = [], []
    while any(t.is_alive() for t in producers):
        time.sleep(args.kill_interval)
        if not any(t.is_alive() for t in producers):
            break
        if len(kills) % 3 == 2 and len(redis_kills) < args.redis_kills:
            redis_kills.append(system.redis.kill())
            kills.append(system.redis.kind)
        else:
            kills.append(random.choice([system.kill_broker, system.kill_scanner])())
    return kills, redis_kills


def drain(tally, timeout: float) -> None:
    """Until both channels received every acknowledged message, or `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with tally.lock:
            if all(tally.acked <= set(got) for got in tally.received.values()):
                return
        time.sleep(0.2)


def settle(system, timeout: float) -> None:
    """Until both channels hold nothing, queued or in flight, or `timeout` seconds: what
    a broker killed last held comes back after --msg-timeout and is finished again."""
    store = Store(connect(system.redis.url))
    deadline = time.monotonic() + timeout
    time.sleep(0.5)
    while time.monotonic() < deadline:
        states = [store.reads.read_channel(TOPIC, channel) for channel in (LIVE, HELD)]
        if not any(s["depth"] or s["in_flight_count"] for s in states):
            return
        time.sleep(0.2)


def run(args) -> dict:
    """Messages go to two channels: LIVE is consumed while processes are killed, HELD
    only once publishing is over, so every acknowledged message must still be in Redis
    after all the kills (a consumer that got a message before a failover lost it would
    hide the loss on LIVE)."""
    random.seed(args.seed)
    workdir = tempfile.mkdtemp(prefix="relay-chaos-")
    system = System(args, workdir)
    tally, stop_consumers, stop_producers = Tally(), threading.Event(), threading.Event()
    started = time.monotonic()
    try:
        system.start()
        for channel in (LIVE, HELD):
            create_channel(system, channel)
        reading = consumers(system, tally, LIVE, stop_consumers, args)
        per_producer = args.messages // args.producers
        producers = [threading.Thread(target=produce, daemon=True, args=(
            system, tally, i, per_producer, args.batch, args.rate / args.producers,
            stop_producers)) for i in range(args.producers)]
        for t in producers:
            t.start()
        kills, redis_kills = kill_while_publishing(system, args, producers)
        reading += consumers(system, tally, HELD, stop_consumers, args)
        drain(tally, args.drain_timeout)
        settle(system, args.drain_timeout)
        stop_consumers.set()
        stop_producers.set()
        for t in reading:
            t.join(5)
        expected = {b"%d:%d" % (i, n) for i in range(args.producers)
                    for n in range(per_producer)}
        return {**delivery(system, tally, expected), "kills": dict(Counter(kills)),
                "redis_kills": [timed(kill, started, tally.acked_at) for kill in redis_kills],
                "publish_retries": tally.publish_retries,
                "consumer_reconnects": tally.reconnects,
                "appendfsync": args.appendfsync, "wait_replicas": args.wait_replicas,
                "cluster": f"{args.cluster} masters x {args.replicas} replicas"
                if args.cluster else None, "supervised": args.supervised,
                "cut_replication": args.cut_replication,
                "brokers": args.brokers, "scanners": args.scanners,
                "seconds": round(time.monotonic() - started, 1)}
    finally:
        stop_consumers.set()
        stop_producers.set()
        system.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def delivery(system, tally, expected: set) -> dict:
    """What the channels received of the messages, and what they hold still. A message
    counts as delivered when both channels received it, as lost when one did not."""
    store = Store(connect(system.redis.url))
    states = [store.reads.read_channel(TOPIC, channel) for channel in (LIVE, HELD)]
    received = {channel: set(got) for channel, got in tally.received.items()}
    everywhere = received[LIVE] & received[HELD]
    return {
        "messages": len(expected), "acknowledged": len(tally.acked),
        "delivered": len(everywhere & expected), "lost": len(tally.acked - everywhere),
        "lost_by_channel": {c: len(tally.acked - got) for c, got in received.items()},
        "unacknowledged_delivered": len(((received[LIVE] | received[HELD]) & expected)
                                        - tally.acked),
        "duplicates": {c: sum(n - 1 for n in got.values())
                       for c, got in tally.received.items()},
        "left_queued": sum(s["depth"] for s in states),
        "left_in_flight": sum(s["in_flight_count"] for s in states),
        "left_deferred": sum(s["deferred_count"] for s in states)}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--consumers", type=int, default=4)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--rate", type=float, default=1000, help="total publish rate, msgs/s")
    p.add_argument("--rdy", type=int, default=50)
    p.add_argument("--brokers", type=int, default=2)
    p.add_argument("--scanners", type=int, default=2)
    p.add_argument("--kill-interval", type=float, default=2.0, help="seconds between kills")
    p.add_argument("--redis-kills", "--master-kills", type=int, default=1,
                   help="kills of Redis; with --cluster, of a master (one at a time)")
    p.add_argument("--appendfsync", choices=["always", "everysec"], default="always")
    p.add_argument("--cluster", type=int, default=0, metavar="MASTERS",
                   help="a local Redis Cluster of this many masters instead of one Redis")
    p.add_argument("--replicas", type=int, default=1, help="with --cluster: per master")
    p.add_argument("--wait-replicas", type=int, default=0,
                   help="brokers' and scanners' --wait-replicas")
    p.add_argument("--cut-replication", type=float, default=0.0, metavar="SECONDS",
                   help="with --cluster: cut each master off its replicas this long "
                        "before it is killed (0: not; keep it under the 2 s "
                        "cluster-node-timeout, or the replica is failed too)")
    p.add_argument("--supervised", action="store_true",
                   help="with --cluster: run it as `relay redis --cluster` (whose supervisor "
                        "starts a killed master again once failed over), not from here")
    p.add_argument("--msg-timeout", default="2s")
    p.add_argument("--drain-timeout", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--keep", action="store_true", help="keep the work folder and its logs")
    args = p.parse_args(argv)
    if args.cluster and args.replicas < 1:
        p.error("--cluster needs --replicas 1 or more: a master kill is survived by failover")
    return args


if __name__ == "__main__":
    print(json.dumps(run(parse())))
