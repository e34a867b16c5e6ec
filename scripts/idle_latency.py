"""What idle consumers cost a broker, and how long one waits for a new message
(issue 2 item 7, issue 24).

Starts an embedded Redis and one broker on free ports, subscribes `--channels`
consumers at RDY 1, each on a channel of its own, spread over `--topics` topics,
waits for the broker to be done with what they made (see settle), and leaves them
idle for `--idle-seconds`: the broker's CPU (share of one core)
and Redis' commands per second over that time are the idle cost. Then it
publishes `--samples` single messages, `--gap-ms` apart, each to the next topic
in turn, and times publish-to-receive at every consumer of that topic (each FINs
what it gets), with the broker's and Redis's CPU per PUB (its deliveries and FINs
included) and the slowest Redis call meanwhile (its slow log, calls over 1 ms; with --by-script every call, and Redis's time per PUB
in each script). `--witness`: another client's PUBs every 20 ms meanwhile, timed.
Prints one JSON line. `--rev REV` runs the broker of another git
revision (checked out into a temporary worktree, as scripts/compare.py does).

    .venv/bin/python scripts/idle_latency.py [--channels 1] [--topics 1]
        [--idle-seconds 10] [--samples 200] [--gap-ms 20] [--rev REV]
"""

import argparse
import json
import multiprocessing
import os
import resource
import selectors
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import redis  # noqa: E402

from relay import embedded  # noqa: E402
from scripts.compare import checked_out  # noqa: E402

SETTLE = 3.0
# Redis's slow log keeps the calls of the PUBs that took longer (the slowest is reported)
SLOW_CALL_US = 1000


class Connection:
    """One connection, consumer (with a topic and channel) or producer; whole frames
    out of what arrived."""

    def __init__(self, port: int, topic: str = "", channel: str = ""):
        self.topic = topic
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sub = f"SUB {topic} {channel}\nRDY 1\n".encode() if topic else b""
        self.sock.sendall(b"  V2" + sub)
        self.buffer = b""

    def frames(self) -> list:
        """The frames that arrived; heartbeats are answered (NOP), not returned."""
        data = self.sock.recv(65536)
        if not data:
            raise EOFError(f"the broker closed a consumer of {self.topic}")
        self.buffer += data
        out = []
        while len(self.buffer) >= 8:
            size, kind = struct.unpack(">ii", self.buffer[:8])
            if len(self.buffer) < 4 + size:
                break
            frame, self.buffer = (kind, self.buffer[8:4 + size]), self.buffer[4 + size:]
            if frame == (0, b"_heartbeat_"):
                self.sock.sendall(b"NOP\n")
            else:
                out.append(frame)
        return out


class Witness:
    """Another client of the broker meanwhile (--witness): a PUB every 20 ms on its own
    connection, each timed, from a process of its own (in this one, reading thousands
    of consumers would hold the GIL it needs)."""

    def __init__(self, port: int):
        context = multiprocessing.get_context("fork")
        self.going, self.done = context.Event(), context.Event()
        self.times = context.Queue()
        self.process = context.Process(target=self.run, args=(port,), daemon=True)
        self.process.start()

    def run(self, port: int) -> None:
        """The first PUB, which makes the topic (nsqd then writes its metadata file,
        seconds on a busy disk), is not timed, nor what comes before go()."""
        connection, times = Connection(port), []
        self.publish(connection)
        self.going.wait()
        while not self.done.is_set():
            started = time.perf_counter()
            self.publish(connection)
            times.append((time.perf_counter() - started) * 1000)
            time.sleep(0.02)
        self.times.put(times)

    @staticmethod
    def publish(connection: Connection) -> None:
        connection.sock.sendall(b"PUB witness\n" + struct.pack(">i", 2) + b"ok")
        replies: list = []
        while not replies:
            replies = connection.frames()
        assert replies == [(0, b"OK")], replies

    def go(self) -> None:
        self.going.set()

    def stop(self) -> dict:
        self.done.set()
        times = sorted(self.times.get(timeout=30))
        self.process.join(10)
        return {"witness_p50_ms": percentile(times, 0.5), "witness_max_ms": round(times[-1], 2),
                "witness_over_100ms": sum(1 for t in times if t > 100)}


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def commands(client) -> int:
    return client.info("stats")["total_commands_processed"] if client else 0


def percentile(samples: list, q: float) -> float:
    return round(samples[max(int(len(samples) * q) - 1, 0)], 2)


def measure(port: int, broker_pid: int, client, args, redis_pid: int | None = None) -> dict:
    """The figures of one run; `client` and `redis_pid` (None for nsqd): its Redis."""
    selector = selectors.DefaultSelector()
    consumers = []
    for i in range(args.channels):
        consumer = Connection(port, f"idle{i % args.topics}", f"c{i}")
        consumers.append(consumer)
        selector.register(consumer.sock, selectors.EVENT_READ, consumer)
    subscribed = 0
    while subscribed < len(consumers):
        for key, _ in selector.select(10):
            subscribed += sum(1 for kind, _ in key.data.frames() if kind == 0)
    producer = Connection(port)
    settle(producer, selector)
    witness = Witness(port) if args.witness else None
    time.sleep(SETTLE)
    cpu, sent, start = cpu_seconds(broker_pid), commands(client), time.monotonic()
    time.sleep(args.idle_seconds)
    elapsed = time.monotonic() - start
    idle_cpu = (cpu_seconds(broker_pid) - cpu) / elapsed
    idle_commands = (commands(client) - sent - 1) / elapsed if client else 0
    per_topic = {}
    for consumer in consumers:
        per_topic[consumer.topic] = per_topic.get(consumer.topic, 0) + 1
    samples = []
    if client:
        client.config_set("slowlog-log-slower-than", 0 if args.by_script else SLOW_CALL_US)
        client.config_set("slowlog-max-len", 1_000_000)
        client.slowlog_reset()
    redis_cpu = cpu_seconds(redis_pid) if redis_pid else 0.0
    cpu = cpu_seconds(broker_pid)
    if witness:
        witness.go()
    for i in range(args.samples):
        time.sleep(args.gap_ms / 1000)
        topic = f"idle{i % args.topics}"
        body = b"%d" % i
        started = time.perf_counter()
        producer.sock.sendall(f"PUB {topic}\n".encode() + struct.pack(">i", len(body)) + body)
        waiting = per_topic[topic]
        while waiting:
            for key, _ in selector.select(5):
                for kind, payload in key.data.frames():
                    if kind == 2 and payload[26:] == body:
                        samples.append((time.perf_counter() - started) * 1000)
                        key.data.sock.sendall(b"FIN " + payload[10:26] + b"\n")
                        waiting -= 1
        replies = []
        while not replies:
            replies = producer.frames()
        assert replies == [(0, b"OK")], replies
    pub_cpu = cpu_seconds(broker_pid) - cpu
    witnessed = witness.stop() if witness else {}
    redis_cpu = cpu_seconds(redis_pid) - redis_cpu if redis_pid else 0.0
    slow = client.slowlog_get(1_000_000) if client else []
    slowest = max(slow, key=lambda e: e["duration"], default=None)
    by_script = redis_by_script(slow) if args.by_script else {}
    samples.sort()
    return {"workload": "idle consumers", "channels": args.channels, "topics": args.topics,
            "broker_cpu_pct": round(idle_cpu * 100, 1),
            "redis_commands_per_s": round(idle_commands),
            "deliveries": len(samples), "p50_ms": percentile(samples, 0.5),
            "p99_ms": percentile(samples, 0.99), "max_ms": round(samples[-1], 2),
            "broker_cpu_ms_per_pub": round(pub_cpu * 1000 / args.samples, 1),
            "redis_cpu_ms_per_pub": round(redis_cpu * 1000 / args.samples, 1),
            "slowest_redis_call_ms": round(slowest["duration"] / 1000, 1) if slowest else 0,
            "slowest_redis_call": slowest_call(slowest), **witnessed,
            **({"redis_ms_per_pub_by_call": {name: round(us / 1000 / args.samples, 1)
                                              for name, us in by_script.items()}}
               if by_script else {})}


def settle(producer: Connection, selector) -> None:
    """A PUB that makes a topic, the consumers' heartbeats answered until its OK. nsqd
    writes its whole metadata file once per channel made, each write under the lock a
    new topic needs: the OK comes after them all (at 5,000 channels, tens of seconds,
    which would otherwise be the idle CPU measured and hold the PUBs timed)."""
    producer.sock.sendall(b"PUB settle\n" + struct.pack(">i", 2) + b"ok")
    selector.register(producer.sock, selectors.EVENT_READ, producer)
    replies: list = []
    while not replies:
        for key, _ in selector.select(10):
            frames = key.data.frames()
            if key.data is producer:
                replies = frames
    selector.unregister(producer.sock)
    assert replies == [(0, b"OK")], replies


def redis_by_script(slow: list) -> dict:
    """Redis's time in each script (by name) and plain command over the slow log's
    entries, most first (--by-script logs every call)."""
    total: dict[str, int] = {}
    for entry in slow:
        words = entry["command"].split()
        name = words[1].decode().rsplit("_", 1)[0] if words[0].upper() == b"FCALL" \
            and len(words) > 1 else words[0].decode(errors="replace").upper()
        total[name] = total.get(name, 0) + entry["duration"]
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def slowest_call(entry) -> str:
    """The slow log's command, its script named: what takes Redis longest."""
    if not entry:
        return ""
    words = entry["command"].split()
    return b" ".join(words[:2]).decode(errors="replace") + f" ({len(words)} words)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--topics", type=int, default=1)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--gap-ms", type=int, default=20)
    parser.add_argument("--rev", help="run the broker of this git revision")
    parser.add_argument("--witness", action="store_true",
                        help="time another client's PUBs (every 20 ms) meanwhile")
    parser.add_argument("--by-script", action="store_true",
                        help="log every Redis call of the PUBs: Redis's time by script")
    parser.add_argument("--nsqd", action="store_true",
                        help="measure nsqd v1.3.0 (../shared/bin/nsq-1.3.0) instead")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.nsqd:
        print(json.dumps({**run_nsqd(args), "revision": "nsqd v1.3.0"}))
        return
    with checked_out(args.rev, "relay-idle-") as source:
        result = run(source, args)
    print(json.dumps({**result, "revision": args.rev or "this checkout"}))


def run_nsqd(args) -> dict:
    """The measurement on nsqd (its Redis figures 0)."""
    from scripts.bench_stats import Nsqd
    nsqd = Nsqd()
    try:
        return measure(nsqd.tcp_port, nsqd.proc.pid, None, args)
    finally:
        nsqd.stop()


def run(source: str, args) -> dict:
    """A Redis and a broker of `source`; the measurement."""
    redis_port, tcp_port = embedded.free_port(), embedded.free_port()
    data = tempfile.mkdtemp()
    redis_proc = embedded.start(redis_port, data, extra=("--save", "", "--appendonly", "no"))
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
           "PYTHONPATH": source}
    broker = subprocess.Popen([sys.executable, "-m", "relay", "broker", "--tcp-address",
                               f"127.0.0.1:{tcp_port}", "--http-address", ""],
                              env=env, stderr=open(os.path.join(data, "broker.log"), "w"),
                              cwd=source)
    try:
        embedded.wait_for_port("127.0.0.1", tcp_port, broker)
        client = redis.Redis(port=redis_port)
        try:
            return measure(tcp_port, broker.pid, client, args, redis_proc.pid)
        except Exception:
            print(f"the broker's log: {data}/broker.log", file=sys.stderr)
            raise
    finally:
        broker.terminate()
        broker.wait(30)
        redis_proc.terminate()
        redis_proc.wait(10)


if __name__ == "__main__":
    main()
