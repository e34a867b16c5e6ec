"""Chaos: publish numbered messages through brokers, scanners and a Redis that are
killed (-9) and restarted while producers and consumers run, then check that every
acknowledged message was delivered. Prints one JSON report. Every third kill is
Redis's, up to --redis-kills; the others are a random broker or scanner.

    chaos.py --messages 20000 --brokers 2 --scanners 2 --appendfsync always

Producers MPUB batches to a random live broker and record a batch as acknowledged
only on OK; on an error or a lost connection they retry it elsewhere (so a batch
may be published twice: duplicates are counted, never lost). Consumers on every
broker FIN each message and reconnect when their broker dies; the messages a dead
broker held in flight come back after --msg-timeout, from a scanner. A Redis kill -9
loses nothing acknowledged with either appendfsync setting (Redis write()s the AOF
before it replies; the kernel keeps it); everysec can lose the last second only
when the machine itself goes down, which this harness does not do.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

import redis

from relay import embedded
from relay.store import Store
from scripts.loadgen import Conn, mpub_command

TOPIC, CHANNEL = "chaos", "c"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class System:
    """Redis, brokers on fixed ports, and scanners, each killable and restartable."""

    def __init__(self, args, workdir):
        self.args = args
        self.workdir = workdir
        self.redis_port = embedded.free_port()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.broker_ports = [embedded.free_port() for _ in range(args.brokers)]
        self.brokers: dict[int, subprocess.Popen] = {}
        self.scanners: list[subprocess.Popen] = []
        self.redis = None
        self.lock = threading.Lock()

    def start_redis(self):
        conf = os.path.join(self.workdir, "redis.conf")
        with open(os.path.join(HERE, "conf", "redis.conf")) as f:
            text = f.read().replace("appendfsync everysec",
                                    f"appendfsync {self.args.appendfsync}")
        with open(conf, "w") as f:
            f.write(text)
        self.redis = embedded.start(self.redis_port, os.path.join(self.workdir, "redis"), conf)

    def _relay(self, *argv, log):
        env = {**os.environ, "REDIS_URL": self.redis_url, "RELAY_LOG_LEVEL": "warning"}
        out = open(os.path.join(self.workdir, log), "ab")
        return subprocess.Popen([sys.executable, "-m", "relay", *argv], env=env, cwd=self.workdir,
                                stdout=out, stderr=subprocess.STDOUT)

    def start_broker(self, port):
        proc = self._relay("broker", "--tcp-address", f"127.0.0.1:{port}", "--http-address", "",
                           "--lookupd-http-address", "", "--msg-timeout",
                           self.args.msg_timeout, log=f"broker-{port}.log")
        embedded.wait_for_port("127.0.0.1", port, proc, timeout=30)
        self.brokers[port] = proc

    def start_scanner(self):
        self.scanners.append(self._relay("scanner", log="scanners.log"))

    def start(self):
        self.start_redis()
        for port in self.broker_ports:
            self.start_broker(port)
        for _ in range(self.args.scanners):
            self.start_scanner()

    def kill_broker(self):
        port = random.choice(self.broker_ports)
        self.brokers[port].send_signal(signal.SIGKILL)
        self.brokers[port].wait()
        time.sleep(0.2)
        self.start_broker(port)
        return "broker"

    def kill_scanner(self):
        i = random.randrange(len(self.scanners))
        self.scanners[i].send_signal(signal.SIGKILL)
        self.scanners[i].wait()
        self.scanners[i] = self._relay("scanner", log="scanners.log")
        return "scanner"

    def kill_redis(self):
        self.redis.send_signal(signal.SIGKILL)
        self.redis.wait()
        time.sleep(0.5)
        self.start_redis()
        return "redis"

    def stop(self):
        for proc in [*self.brokers.values(), *self.scanners]:
            proc.terminate()
        for proc in [*self.brokers.values(), *self.scanners]:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.redis:
            self.redis.terminate()
            self.redis.wait(10)


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.acked: set[bytes] = set()
        self.received: Counter = Counter()
        self.publish_retries = 0
        self.reconnects = 0


def produce(system, tally, index, count, batch, rate, stop):
    """Publish `count` numbered messages in batches, each until it is acknowledged."""
    bodies = [b"%d:%d" % (index, n) for n in range(count)]
    conn = None
    pause = batch / rate if rate else 0
    for start in range(0, count, batch):
        chunk = bodies[start:start + batch]
        command = mpub_command(TOPIC.encode(), chunk)
        while not stop.is_set():
            try:
                if conn is None:
                    conn = Conn("127.0.0.1", random.choice(system.broker_ports))
                conn.sock.settimeout(10)
                conn.sock.sendall(command)
                conn.expect_ok()
                with tally.lock:
                    tally.acked.update(chunk)
                break
            except (OSError, EOFError, RuntimeError):
                with tally.lock:
                    tally.publish_retries += 1
                if conn is not None:
                    conn.sock.close()
                conn = None
                time.sleep(0.05)
        time.sleep(pause)
    if conn is not None:
        conn.sock.close()


def consume(system, tally, stop, rdy):
    """SUB on a random broker, FIN everything, reconnect when the broker goes away."""
    while not stop.is_set():
        try:
            conn = Conn("127.0.0.1", random.choice(system.broker_ports))
            conn.sock.settimeout(1.0)
            conn.sock.sendall(f"SUB {TOPIC} {CHANNEL}\n".encode())
            conn.expect_ok()
            conn.sock.sendall(b"RDY %d\n" % rdy)
            while not stop.is_set():
                try:
                    frames = list(conn.frames())
                except TimeoutError:
                    continue
                fins = []
                for kind, data in frames:
                    if kind == 2:
                        fins.append(b"FIN " + data[10:26] + b"\n")
                        with tally.lock:
                            tally.received[data[26:]] += 1
                    elif data == b"_heartbeat_":
                        fins.append(b"NOP\n")
                if fins:
                    conn.sock.sendall(b"".join(fins))
        except (OSError, EOFError, RuntimeError):
            with tally.lock:
                tally.reconnects += 1
            time.sleep(0.1)


def run(args) -> dict:
    random.seed(args.seed)
    workdir = tempfile.mkdtemp(prefix="relay-chaos-")
    system = System(args, workdir)
    tally, stop_consumers, stop_producers = Tally(), threading.Event(), threading.Event()
    started = time.monotonic()
    kills = []
    try:
        system.start()
        consumers = [threading.Thread(target=consume, args=(system, tally, stop_consumers,
                                                            args.rdy), daemon=True)
                     for _ in range(args.consumers)]
        per_producer = args.messages // args.producers
        producers = [threading.Thread(target=produce, daemon=True, args=(
            system, tally, i, per_producer, args.batch, args.rate / args.producers,
            stop_producers)) for i in range(args.producers)]
        for t in consumers + producers:
            t.start()
        while any(t.is_alive() for t in producers):
            time.sleep(args.kill_interval)
            if not any(t.is_alive() for t in producers):
                break
            if len(kills) % 3 == 2 and kills.count("redis") < args.redis_kills:
                kills.append(system.kill_redis())
            else:
                kills.append(random.choice([system.kill_broker, system.kill_scanner])())
        expected = {b"%d:%d" % (i, n) for i in range(args.producers)
                    for n in range(per_producer)}
        deadline = time.monotonic() + args.drain_timeout
        while time.monotonic() < deadline:
            with tally.lock:
                if tally.acked <= set(tally.received):
                    break
            time.sleep(0.2)
        time.sleep(0.5)
        stop_consumers.set()
        stop_producers.set()
        for t in consumers:
            t.join(5)
        state = Store(redis.Redis.from_url(system.redis_url)).read_channel(TOPIC, CHANNEL)
        received = set(tally.received)
        return {
            "messages": len(expected), "acknowledged": len(tally.acked),
            "delivered": len(received & expected),
            "lost": len(tally.acked - received),
            "unacknowledged_delivered": len((received & expected) - tally.acked),
            "duplicates": sum(n - 1 for n in tally.received.values()),
            "left_queued": state["depth"], "left_in_flight": state["in_flight_count"],
            "left_deferred": state["deferred_count"], "kills": dict(Counter(kills)),
            "publish_retries": tally.publish_retries, "consumer_reconnects": tally.reconnects,
            "appendfsync": args.appendfsync, "brokers": args.brokers,
            "scanners": args.scanners, "seconds": round(time.monotonic() - started, 1)}
    finally:
        stop_consumers.set()
        stop_producers.set()
        system.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


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
    p.add_argument("--redis-kills", type=int, default=1)
    p.add_argument("--appendfsync", choices=["always", "everysec"], default="always")
    p.add_argument("--msg-timeout", default="2s")
    p.add_argument("--drain-timeout", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--keep", action="store_true", help="keep the work folder and its logs")
    return p.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(run(parse())))
