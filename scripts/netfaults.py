"""Network faults between hosts under load: Redis, the brokers (and a scanner) and the
clients each on a host of their own (network namespaces on a private bridge,
tests/helpers/netns.py), producers PUBlishing and consumers FINishing throughout
(scripts/chaos.py's), while one fault is on:

    latency    50 ms added to each round trip between the brokers and Redis (a delaying
               proxy on Redis' host, 25 ms each way)
    loss       5% of TCP packets dropped at random in and out of the brokers' host (nft)
    partition  Redis' cable pulled (its bridge port down) for --fault seconds
    consumer   the clients cut off one broker (nft): its consumer, alone there, must
               notice and reconnect; producers and the other consumers use the other

Prints one JSON report per scenario: acknowledged, delivered, lost, duplicates; every
refused publish (its error, how long it took: never past --redis-timeout), the slowest
publish, consumer reconnects; the time to resume after the fault (the first publish
acknowledged, the first delivery), or for the faults that stop nothing the longest
gap between acknowledgements. Needs root, iproute2 and nftables.

    python -m scripts.netfaults --scenario partition --fault 10 --rate 400
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import NamedTuple

from relay import embedded
from scripts import chaos
from tests.helpers import netns

SCENARIOS = ("latency", "loss", "partition", "consumer")
REDIS_PORT, PROXY_PORT = 6379, 6380
BROKER_PORTS = (4150, 4152)     # each broker's HTTP port is the next one
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Brokers(NamedTuple):
    """Where chaos's producers and consumers find their brokers."""

    host: str
    broker_ports: list


# -- the clients' side: a process on the clients' host --------------------------------


def clients(args) -> dict:
    """Producers and consumers until a line on stdin, then a drain: the raw tally."""
    tally, stop_producers, stop_consumers = chaos.Tally(), threading.Event(), threading.Event()
    publish_to = Brokers(args.host, args.publish_to)
    for channel in (chaos.LIVE, chaos.HELD):
        chaos.create_channel(publish_to, channel)
    reading = chaos.consumers(Brokers(args.host, args.consume_from), tally, chaos.LIVE,
                              stop_consumers, args)
    if args.lone_consumer:
        reading.append(threading.Thread(target=chaos.consume, daemon=True, args=(
            publish_to, tally, chaos.LIVE, stop_consumers, args.rdy, args.lone_consumer)))
        reading[-1].start()
    producers = [threading.Thread(target=chaos.produce, daemon=True, args=(
        publish_to, tally, i, 10 ** 9, 1, args.rate / args.producers, stop_producers))
        for i in range(args.producers)]
    for t in producers:
        t.start()
    sys.stdin.readline()
    stop_producers.set()
    for t in producers:
        t.join(15)
    reading += chaos.consumers(publish_to, tally, chaos.HELD, stop_consumers, args)
    chaos.drain(tally, args.drain_timeout)
    stop_consumers.set()
    with tally.lock:
        received = {c: set(got) for c, got in tally.received.items()}
        return {"acknowledged": len(tally.acked),
                "delivered": len(tally.acked & received[chaos.LIVE] & received[chaos.HELD]),
                "lost_by_channel": {c: len(tally.acked - got) for c, got in received.items()},
                "duplicates": {c: sum(n - 1 for n in got.values())
                               for c, got in tally.received.items()},
                "acked_at": tally.acked_at, "refused": tally.refused,
                "delivered_at": tally.delivered_at, "reconnects": tally.reconnects}


# -- the hosts and relay on them ------------------------------------------------------


class Stack:
    """Redis, two brokers and a scanner on their hosts, with the options under test."""

    def __init__(self, hosts: netns.Hosts, workdir: str, redis_timeout: str,
                 msg_timeout: str, delay_ms: int = 0):
        self.hosts, self.workdir = hosts, workdir
        self.redis_timeout, self.msg_timeout = redis_timeout, msg_timeout
        self.delay_ms = delay_ms
        self.brokers: list[subprocess.Popen] = []
        self.broker_host = hosts.addr("brokers")

    def log(self, name: str) -> str:
        return os.path.join(self.workdir, name)

    @property
    def redis_url(self) -> str:
        port = PROXY_PORT if self.delay_ms else REDIS_PORT
        return f"redis://{self.hosts.addr('redis')}:{port}/0"

    def start(self) -> None:
        address = self.hosts.addr("redis")
        args = embedded.server_args(REDIS_PORT, self.log("redis"), os.path.join(
            HERE, "conf", "redis.conf"), host=address) + ["--protected-mode", "no",
                                                           "--appendfsync", "always"]
        os.makedirs(self.log("redis"), exist_ok=True)
        redis = self.hosts.start("redis", args, self.log("redis.log"))
        self.hosts.wait_for_port("redis", address, REDIS_PORT, redis)
        if self.delay_ms:
            proxy = self.hosts.python("redis", "tests.helpers.delay_proxy",
                                      f"{address}:{PROXY_PORT}", f"{address}:{REDIS_PORT}",
                                      str(self.delay_ms // 2), log=self.log("proxy.log"))
            self.hosts.wait_for_port("redis", address, PROXY_PORT, proxy)
        for port in BROKER_PORTS:
            self.brokers.append(self._relay(
                "broker", "--tcp-address", f"{self.broker_host}:{port}",
                "--http-address", f"{self.broker_host}:{port + 1}",
                "--lookupd-http-address", "", "--msg-timeout", self.msg_timeout))
        self._relay("scanner")
        for port, proc in zip(BROKER_PORTS, self.brokers):
            self.hosts.wait_for_port("brokers", self.broker_host, port, proc, timeout=30)

    def _relay(self, command: str, *args: str) -> subprocess.Popen:
        env = {**os.environ, "REDIS_URL": self.redis_url, "RELAY_LOG_LEVEL": "info"}
        return self.hosts.python("brokers", "relay", command, "--redis-timeout",
                                 self.redis_timeout, *args, log=self.log(f"{command}.log"),
                                 env=env, cwd=self.workdir)

    def clients(self, args, publish_to: list, consume_from: list,
                lone_consumer: int = 0) -> subprocess.Popen:
        argv = ["clients", "--host", self.broker_host, "--producers", str(args.producers),
                "--rate", str(args.rate), "--consumers", str(args.consumers),
                "--rdy", str(args.rdy), "--drain-timeout", str(args.drain_timeout),
                "--publish-to", *map(str, publish_to), "--consume-from",
                *map(str, consume_from), "--lone-consumer", str(lone_consumer)]
        return self.hosts.python("clients", "scripts.netfaults", *argv, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=open(self.log("clients.log"), "ab"))

    def restarted(self) -> int:
        """Brokers no longer running (each must have lived through the fault)."""
        return sum(proc.poll() is not None for proc in self.brokers)

    def tracebacks(self) -> int:
        count = 0
        for name in ("broker.log", "scanner.log"):
            with open(self.log(name), errors="replace") as f:
                count += f.read().count("Traceback")
        return count


# -- a scenario -----------------------------------------------------------------------


def run(scenario: str, args, hosts: netns.Hosts | None = None) -> dict:
    """One scenario on fresh hosts (or `hosts`, left as they are for the caller's
    cleanup): its report."""
    workdir = tempfile.mkdtemp(prefix=f"relay-net-{scenario}-")
    own = hosts is None
    hosts = hosts or netns.Hosts()
    try:
        stack = Stack(hosts, workdir, args.redis_timeout, args.msg_timeout,
                      delay_ms=args.delay if scenario == "latency" else 0)
        stack.start()
        lone = BROKER_PORTS[1] if scenario == "consumer" else 0
        ports = [BROKER_PORTS[0]] if lone else list(BROKER_PORTS)
        proc = stack.clients(args, ports, ports, lone)
        time.sleep(args.warmup)
        begun = time.monotonic()
        fault(hosts, scenario, True)
        time.sleep(args.fault)
        dropped = fault(hosts, scenario, False)
        ended = time.monotonic()
        time.sleep(args.after)
        out, _ = proc.communicate(b"stop\n", timeout=args.drain_timeout + 30)
        report = figures(json.loads(out), scenario, begun, ended, lone)
        report.update(packets_dropped=dropped, brokers_restarted=stack.restarted(),
                      tracebacks=stack.tracebacks(),
                      workdir=workdir if args.keep else None)
        return report
    finally:
        if own:
            hosts.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def fault(hosts: netns.Hosts, scenario: str, on: bool) -> int:
    """Put the scenario's fault on, or take it off: the packets nft dropped (latency is
    the proxy's, on all along)."""
    if scenario == "partition":
        (hosts.cut if on else hosts.mend)("redis")
    elif scenario in ("loss", "consumer"):
        host = "brokers" if scenario == "loss" else "clients"
        if not on:
            return hosts.undrop(host)
        if scenario == "loss":
            hosts.drop(host, "meta l4proto tcp numgen random mod 20 0")
        else:
            hosts.drop(host, f"tcp sport {BROKER_PORTS[1]}", f"tcp dport {BROKER_PORTS[1]}")
    return 0


def refusal(error: str) -> str:
    """An error frame's code, command and outcome: `E_PUB_FAILED PUB failed`, or
    `E_PUB_FAILED PUB outcome unknown` where Redis may have taken it."""
    return error.split(":")[0].split(",")[0][:40]


def figures(raw: dict, scenario: str, begun: float, ended: float, lone: int) -> dict:
    """The report of a scenario from the clients' tally: the fault was on from `begun`
    to `ended` (monotonic; the same clock in every process)."""
    tries = [(sent, done, None) for sent, done in raw["acked_at"]] + raw["refused"]
    acked_after = [done for sent, done in raw["acked_at"] if done >= ended]
    delivered_after = [when for when, port in raw["delivered_at"]
                       if when >= ended and (not lone or port == lone)]
    during = sorted(done for _, done in raw["acked_at"] if begun <= done <= ended)
    gaps = [b - a for a, b in zip([begun, *during], [*during, ended])]
    lost = max(raw["lost_by_channel"].values())
    return {
        "scenario": scenario, "fault_s": round(ended - begun, 1),
        "acknowledged": raw["acknowledged"], "delivered": raw["delivered"], "lost": lost,
        "lost_by_channel": raw["lost_by_channel"], "duplicates": raw["duplicates"],
        "publishes_refused": len(raw["refused"]),
        "refusals": dict(Counter(refusal(error) for _, _, error in raw["refused"])),
        "slowest_refusal_s": round(max((d - s for s, d, _ in raw["refused"]), default=0), 2),
        "slowest_publish_s": round(max(d - s for s, d, _ in tries), 2),
        "median_publish_s": round(statistics.median(d - s for s, d in raw["acked_at"]), 3),
        "longest_publish_gap_s": round(max(gaps), 2),
        "publish_resumed_s": round(min(acked_after) - ended, 2) if acked_after else None,
        "delivery_resumed_s": round(min(delivered_after) - ended, 2)
        if delivered_after else None,
        "consumer_reconnects": raw["reconnects"]}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", nargs="?", choices=["run", "clients"], default="run",
                   help="clients: the clients' process, started by run on their host")
    p.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    p.add_argument("--fault", type=float, default=10.0, help="seconds the fault lasts")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--after", type=float, default=5.0, help="seconds of load after it")
    p.add_argument("--delay", type=int, default=50, help="latency: ms added per round trip")
    p.add_argument("--producers", type=int, default=4, help="each PUBlishes one at a time")
    p.add_argument("--rate", type=float, default=400, help="total publish rate, msgs/s")
    p.add_argument("--consumers", type=int, default=4)
    p.add_argument("--rdy", type=int, default=20)
    p.add_argument("--redis-timeout", default="2s")
    p.add_argument("--msg-timeout", default="3s")
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--keep", action="store_true", help="keep the work folder and its logs")
    p.add_argument("--host", help=argparse.SUPPRESS)
    p.add_argument("--publish-to", type=int, nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--consume-from", type=int, nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--lone-consumer", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> None:
    args = parse()
    if args.mode == "clients":
        print(json.dumps(clients(args)))
        return
    reason = netns.missing()
    if reason:
        sys.exit(f"netfaults: {reason}")
    for scenario in SCENARIOS if args.scenario == "all" else [args.scenario]:
        print(json.dumps(run(scenario, args)), flush=True)


if __name__ == "__main__":
    main()
