"""A rolling upgrade under load: the previous release's brokers, scanner and jobs worker
(PREVIOUS, from a git worktree as scripts/compare.py makes one) are replaced one at a
time by this checkout's while producers publish and consumers read, then
`relay-admin upgrade finish` runs (once no live process blocks it: a broker killed -9 is
in the registry until its registration expires). Prints one JSON report: every acknowledged message
delivered or not, the longest wait of a producer for a publish's OK, `relay-admin
upgrade status` after each step, and the tracebacks in any process's log.

    .venv/bin/python -m scripts.rolling_upgrade [--rate 1000] [--kill] [--previous REV]

Producers PUB one message at a time to a random broker and, when their connection
closes or a publish fails, connect again to a random broker at once and send it again
(as pynsq's Writer, which publishes through any connected nsqd). A broker is replaced
by SIGTERM (it drains: its consumers get CLOSE_WAIT), then the new one is started on
its port; with --kill, the second old broker is killed with -9 instead, and what it held
in flight comes back after --msg-timeout from the scanner. Messages go to two channels
as in scripts/chaos.py: `c` read throughout, `held` only once publishing is over. `held`
is ordered by the producer's number (the topic's order key rule: the text before ":"),
made so under the previous layout; once `upgrade finish` has run, a third channel,
`after`, is made ordered (so under the new layout), takes what is published from then
on and is read at the end too. The report says how each ordered channel keeps its
waiting messages and how many came before an earlier one of their key. A fourth channel,
`backlog`, unordered, takes every message and is read at the end, under the new layout:
the report says how many of the acknowledged messages it missed and the most lots
(layout 4, scripts/lib/inflight.lua) seen in flight at once while it drained. Last, on a
topic of its own, a message of priority 9 (layout 5) published behind 20 plain ones:
the report gives the first message a consumer at RDY 1 got.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.client import HTTPConnection

import redis

from relay import embedded
from relay.store import Store, runner
from relay.store.connection import connect
from relay.store.inflight import is_lot
from relay.store.keys import ChannelKeys
from relay.store.ordering import SEQS_FIELD
from scripts.chaos import (HELD, HERE, IDENTIFY_UNBUFFERED, LIVE, TOPIC, Tally, consumers,
                           create_channel, delivery, drain, produce, redis_conf, settle,
                           stop_in_turn)
from scripts.loadgen import Conn, mpub_command
from scripts.chaos_redis import SingleRedis, kill9
from scripts.compare import checked_out

# relay 0.5.0, the release before layout 5 (issue 60 part 2): its ids carry no priority.
# The next release that changes a layout names its previous here.
PREVIOUS = "1f5a0e79f5f0ae1783e51f27bae8703b5486af15"
AFTER = "after"     # the channel made ordered once the new layout is in force
BACKLOG = "backlog"     # an unordered channel read once the new layout is in force
PRIORITY_TOPIC = "prio"     # a message of priority 9 published once layout 5 is in force
RELAY_ADMIN = os.path.join(os.path.dirname(sys.executable), "relay-admin")


class Deployment:
    """One Redis, and brokers on fixed ports, a scanner and a jobs worker, each run from
    the previous release's checkout or this one."""

    host = "127.0.0.1"

    def __init__(self, args, workdir: str, previous: str):
        self.args, self.workdir = args, workdir
        self.sources = {"previous": previous, "this": HERE}
        self.redis = SingleRedis(redis_conf(workdir, "always"), workdir)
        self.broker_ports = [embedded.free_port() for _ in range(2)]
        self.http_ports = {port: embedded.free_port() for port in self.broker_ports}
        self.brokers: dict[int, subprocess.Popen] = {}
        self.scanner: subprocess.Popen | None = None
        self.jobs: subprocess.Popen | None = None
        self.logs: list[str] = []

    def _relay(self, release: str, name: str, *argv: str) -> subprocess.Popen:
        env = {**os.environ, "REDIS_URL": self.redis.url, "RELAY_LOG_LEVEL": "warning",
               "PYTHONPATH": self.sources[release]}
        log = os.path.join(self.workdir, f"{release}-{name}.log")
        self.logs.append(log)
        return subprocess.Popen([sys.executable, "-m", "relay", *argv], env=env,
                                cwd=self.workdir, stdout=open(log, "ab"),
                                stderr=subprocess.STDOUT)

    def start_broker(self, release: str, port: int) -> None:
        proc = self._relay(release, f"broker-{port}", "broker",
                           "--tcp-address", f"127.0.0.1:{port}",
                           "--http-address", f"127.0.0.1:{self.http_ports[port]}",
                           "--lookupd-http-address", "", "--msg-timeout",
                           self.args.msg_timeout)
        embedded.wait_for_port("127.0.0.1", port, proc, timeout=30)
        self.brokers[port] = proc

    def start(self, release: str) -> None:
        self.redis.start()
        for port in self.broker_ports:
            self.start_broker(release, port)
        self.scanner = self._relay(release, "scanner", "scanner")
        self.jobs = self._relay(release, "jobs", "jobs")

    def replace_broker(self, port: int, kill: bool) -> float:
        """The old broker stopped (drained, or killed -9), the new one serving on its
        port: the seconds the port was not served."""
        old = self.brokers[port]
        if kill:
            kill9(old)
        else:
            old.terminate()
            old.wait(30)
        stopped = time.monotonic()
        self.start_broker("this", port)
        return time.monotonic() - stopped

    def replace_scanner(self) -> None:
        """The new scanner first: the slots are never unscanned."""
        old, self.scanner = self.scanner, self._relay("this", "scanner", "scanner")
        old.terminate()
        old.wait(30)

    def replace_jobs(self) -> None:
        self.jobs.terminate()
        self.jobs.wait(30)
        self.jobs = self._relay("this", "jobs", "jobs")

    def processes(self) -> list:
        return [*self.brokers.values(), self.scanner, self.jobs]

    def stop(self) -> None:
        """relay's processes first, so they leave their registries while Redis runs."""
        stop_in_turn([p for p in self.processes() if p is not None], self.redis.processes())

    def tracebacks(self) -> list[str]:
        """Each process log's tracebacks: (log, first line after "Traceback")."""
        found = []
        for log in sorted(set(self.logs)):
            with open(log, errors="replace") as f:
                text = f.read()
            found += [f"{os.path.basename(log)}: {m}"
                      for m in re.findall(r"Traceback[^\n]*\n([^\n]*)", text)]
        return found


def admin(deployment: Deployment, *argv: str) -> subprocess.CompletedProcess:
    """This release's relay-admin."""
    return subprocess.run([RELAY_ADMIN, "--redis-url", deployment.redis.url, *argv],
                          capture_output=True, text=True, timeout=30)


def status(deployment: Deployment) -> dict:
    """`relay-admin upgrade status --json`, shortened: the layout in force, and how many
    live processes of each kind and release."""
    out = admin(deployment, "upgrade", "status", "--json")
    if out.returncode:
        return {"error": out.stderr.strip()}
    data = json.loads(out.stdout)
    counts: dict[str, int] = {}
    for p in data["processes"]:
        key = f"{p['kind']} {p['release']}"
        counts[key] = counts.get(key, 0) + 1
    return {"layout": data["layout"], "processes": dict(sorted(counts.items())),
            "next": data["next"]}


def wait_registered(deployment: Deployment, kinds: tuple, timeout: float = 30.0) -> None:
    """Until a process of each kind is in the registry: under load a jobs worker took
    longer than a settle to register, and the first step missed it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = {key.split()[0] for key in status(deployment).get("processes", {})}
        if live >= set(kinds):
            return
        time.sleep(0.2)
    raise TimeoutError(f"not all of {kinds} registered after {timeout:.0f} s")


def upgrade(deployment: Deployment, args, steps: list) -> dict:
    """Replace every process, one at a time, then finish; each step's status."""
    def step(name: str, **figures) -> None:
        time.sleep(args.settle)     # a heartbeat or two: registrations show the change
        steps.append({"step": name, **figures, "status": status(deployment)})

    step("previous release serving")
    deployment.replace_scanner()
    step("scanner replaced")
    deployment.replace_jobs()
    step("jobs worker replaced")
    first, second = deployment.broker_ports
    step("broker 1 replaced", unserved_s=round(deployment.replace_broker(first, False), 2))
    step("broker 2 " + ("killed -9 and replaced" if args.kill else "replaced"),
         unserved_s=round(deployment.replace_broker(second, args.kill), 2))
    unblocked = time.monotonic() + 30    # a killed broker's registration expires in 15 s
    while status(deployment)["next"]["blocked_by"] and time.monotonic() < unblocked:
        time.sleep(0.5)
    loaded = runner.libraries(redis.Redis.from_url(deployment.redis.url))
    finished = admin(deployment, "upgrade", "finish")
    step("upgrade finish")
    admin(deployment, "order", TOPIC, AFTER)     # made ordered, so gated from its first
    return {"returncode": finished.returncode,
            "output": (finished.stdout + finished.stderr).strip(),
            "libraries": {"before": loaded, "after": runner.libraries(
                redis.Redis.from_url(deployment.redis.url))}}


def in_order(received: Counter) -> dict:
    """An ordered channel's messages "<producer>:<n>" by first receipt (a Counter keeps
    that order): how many, and how many came after a later one of their producer."""
    last: dict[bytes, int] = {}
    late = 0
    for body in received:
        producer, n = body.split(b":")
        late += int(n) < last.get(producer, -1)
        last[producer] = max(int(n), last.get(producer, -1))
    return {"received": len(received), "out_of_order": late}


def gate_shape(deployment: Deployment, channel: str) -> str:
    """How an ordered channel keeps its waiting messages (lib/order.lua)."""
    client = connect(deployment.redis.url)
    numbered = client.hexists(ChannelKeys.of(TOPIC, channel).meta, SEQS_FIELD)
    return "numbered" if numbered else "sorted set"


def watch_lots(deployment: Deployment, stop: threading.Event, seen: list) -> threading.Thread:
    """A thread noting in seen[0] the most lots in flight at once on BACKLOG."""
    client = connect(deployment.redis.url)
    key = ChannelKeys.of(TOPIC, BACKLOG).inflight

    def watch() -> None:
        while not stop.is_set():
            seen[0] = max(seen[0], sum(map(is_lot, client.zrange(key, 0, -1))))
            time.sleep(0.05)
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def priority_first(deployment: Deployment) -> dict:
    """Once layout 5 is in force: on a topic of its own, 20 plain messages, then one
    published with priority 9 over HTTP (refused before layout 5), then a consumer at
    RDY 1: the body and id of the first message it gets, which must be that one."""
    host, port = deployment.host, deployment.broker_ports[0]
    made = Conn(host, port)
    made.sock.sendall(f"SUB {PRIORITY_TOPIC} c\n".encode())
    made.expect_ok()
    made.sock.sendall(mpub_command(PRIORITY_TOPIC.encode(), [b"plain"] * 20))
    made.expect_ok()
    made.sock.close()
    http = HTTPConnection(host, deployment.http_ports[port], timeout=10)
    http.request("POST", f"/pub?topic={PRIORITY_TOPIC}&priority=9", b"urgent")
    status = http.getresponse().status
    http.close()
    consumer = Conn(host, port)
    consumer.sock.settimeout(10)
    consumer.sock.sendall(f"SUB {PRIORITY_TOPIC} c\nRDY 1\n".encode())
    consumer.expect_ok()
    first = next(data for kind, data in iter_frames(consumer) if kind == 2)
    consumer.sock.close()
    return {"status": status, "first": first[26:].decode(), "id": first[10:26].decode()}


def iter_frames(conn: Conn):
    """The frames of a connection, one recv after another."""
    while True:
        yield from conn.frames()


def drain_after(deployment: Deployment, timeout: float) -> None:
    """Until the channels read after the upgrade hold nothing."""
    store = Store(connect(deployment.redis.url))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [store.reads.read_channel(TOPIC, c) for c in (AFTER, BACKLOG)]
        if not any(s["depth"] or s["in_flight_count"] for s in states):
            return
        time.sleep(0.2)


def run(args) -> dict:
    workdir = tempfile.mkdtemp(prefix="relay-upgrade-")
    tally, stop_consumers, stop_producers = Tally(), threading.Event(), threading.Event()
    waits: list[float] = []
    steps: list[dict] = []
    started = time.monotonic()
    with checked_out(args.previous, "relay-previous-") as previous:
        deployment = Deployment(args, workdir, previous)
        try:
            deployment.start("previous")
            wait_registered(deployment, ("broker", "scanner", "jobs"))
            for channel in (LIVE, HELD, BACKLOG):
                create_channel(deployment, channel)
            admin(deployment, "order-key", TOPIC, "--separator", ":")
            admin(deployment, "order", TOPIC, HELD)
            time.sleep(1.5)     # brokers read the rule within a second
            reading = consumers(deployment, tally, LIVE, stop_consumers, args)
            producers = [threading.Thread(target=produce, daemon=True, args=(
                deployment, tally, i, 10 ** 9, 1, args.rate / args.producers,
                stop_producers, waits)) for i in range(args.producers)]
            for t in producers:
                t.start()
            publishing = time.monotonic()
            finished = upgrade(deployment, args, steps)
            time.sleep(args.settle)
            stop_producers.set()
            for t in producers:
                t.join(15)
            publishing = time.monotonic() - publishing
            reading += consumers(deployment, tally, HELD, stop_consumers, args,
                                 IDENTIFY_UNBUFFERED)
            after = Tally()
            after.received = {AFTER: Counter()}
            reading += consumers(deployment, after, AFTER, stop_consumers, args,
                                 IDENTIFY_UNBUFFERED)
            backlog, lots = Tally(), [0]
            backlog.received = {BACKLOG: Counter()}
            reading += [watch_lots(deployment, stop_consumers, lots)]
            reading += consumers(deployment, backlog, BACKLOG, stop_consumers, args)
            drain(tally, args.drain_timeout)
            settle(deployment, args.drain_timeout)
            drain_after(deployment, args.drain_timeout)
            prioritized = priority_first(deployment)
            stop_consumers.set()
            for t in reading:
                t.join(5)
            published = {m for m in tally.acked}
            return {**delivery(deployment, tally, published),
                    "previous": args.previous, "kill": args.kill,
                    "publish_rate": round(len(tally.acked) / publishing),
                    "longest_publish_wait_ms": round(max(waits) * 1000, 1) if waits else None,
                    "publish_retries": tally.publish_retries,
                    "refusals": sorted({e for _, _, e in tally.refused})[:10],
                    "steps": steps, "finish": finished,
                    "ordered": {channel: {"gate": gate_shape(deployment, channel),
                                          **in_order(got.received[channel])}
                                for channel, got in ((HELD, tally), (AFTER, after))},
                    "backlog": {"lost": len(tally.acked - set(backlog.received[BACKLOG])),
                                "most_lots_in_flight": lots[0]},
                    "priority": prioritized,
                    "tracebacks": deployment.tracebacks(),
                    "seconds": round(time.monotonic() - started, 1)}
        finally:
            stop_consumers.set()
            stop_producers.set()
            deployment.stop()
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--previous", default=PREVIOUS, help="the release upgraded from")
    p.add_argument("--rate", type=float, default=1000, help="total publish rate, msgs/s")
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--consumers", type=int, default=4)
    p.add_argument("--rdy", type=int, default=50)
    p.add_argument("--kill", action="store_true",
                   help="kill the second old broker with -9 instead of stopping it")
    p.add_argument("--settle", type=float, default=2.0,
                   help="seconds of load between steps")
    p.add_argument("--msg-timeout", default="2s")
    p.add_argument("--drain-timeout", type=float, default=60.0)
    p.add_argument("--keep", action="store_true", help="keep the work folder and its logs")
    return p.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(run(parse())))
