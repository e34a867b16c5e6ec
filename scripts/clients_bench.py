"""Consumers as users run them (issue 18): pynsq, gnsq and a go-nsq-style raw client,
each draining a prefilled topic of 200 B messages at max_in_flight (RDY) 2500, FIN
each, with nsqd's default output buffering. Reports the broker's, Redis's and the
client's own CPU per message, since all of them share the machine's cores.

Each run gets a fresh scripts/bench.py Stack (one broker). pynsq and gnsq run in a
process of their own (this script with --consume; pynsq needs tornado's IOLoop); raw
is scripts/loadgen.py sub --rdy 2500 --output-buffer-timeout 0, which prefills the
topic itself with the same loadgen.prefill (MPUB of 100) the others get. CPU comes
from /proc (bench.CpuSampler) over the window from the first to the last message
received; for raw it is loadgen's window, from its RDY to the last message. A run
exits 1 if the client did not count every message once (pynsq and gnsq by id) or the
channel is not left empty with nothing requeued or timed out (which catches a raw
client that counted a redelivery in place of a missing message).

    .venv/bin/python scripts/clients_bench.py [--messages 200000] [--runs 3]
        [--clients pynsq gnsq raw]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from scripts import loadgen  # noqa: E402
from scripts.bench import LOADGEN, CpuSampler, Stack  # noqa: E402

CLIENTS = ["pynsq", "gnsq", "raw"]
TOPIC, CHANNEL = "clients", "bench"
SIZE = 200
MAX_IN_FLIGHT = 2500
STALL_S = 30        # a consumer gives up when no message came for this long
DRAIN_S = 10        # how long the broker may take to settle the last FINs


class Tally:
    """The message ids a consumer received, with wall clock and process CPU at the
    first and the last, so the window is the consuming and nothing else."""

    def __init__(self, expected: int):
        self.expected, self.ids, self.received = expected, set(), 0
        self.first = self.last = self.cpu_first = self.cpu_last = None
        self.started = time.time()

    def add(self, message_id) -> bool:
        """Count one message; whether all expected have come."""
        now, cpu = time.time(), time.process_time()
        if self.first is None:
            self.first, self.cpu_first = now, cpu
        self.last, self.cpu_last = now, cpu
        self.ids.add(message_id)
        self.received += 1
        return self.received >= self.expected

    def stalled(self) -> bool:
        return time.time() - (self.last or self.started) > STALL_S

    def report(self) -> dict:
        return {"received": self.received, "unique": len(self.ids), "first": self.first,
                "last": self.last,
                "client_cpu_s": self.cpu_last - self.cpu_first if self.received else 0}


def consume_pynsq(port: int, expected: int) -> dict:
    """nsq.Reader on tornado; returning True from the handler FINs the message."""
    import nsq
    from tornado.ioloop import IOLoop, PeriodicCallback

    tally, loop = Tally(expected), IOLoop.current()

    def handler(message):
        if tally.add(message.id):
            loop.call_later(0.5, loop.stop)     # time for the last FINs to go out
        return True

    nsq.Reader(topic=TOPIC, channel=CHANNEL, message_handler=handler,
               nsqd_tcp_addresses=[f"127.0.0.1:{port}"], max_in_flight=MAX_IN_FLIGHT)
    PeriodicCallback(lambda: tally.stalled() and loop.stop(), 1000).start()
    nsq.run()
    return tally.report()


def consume_gnsq(port: int, expected: int) -> dict:
    """gnsq.Consumer on gevent; a handler that returns FINs the message."""
    import gevent
    import gevent.event
    import gnsq

    tally, done = Tally(expected), gevent.event.Event()

    def handler(consumer, message):
        if tally.add(message.id):
            done.set()

    consumer = gnsq.Consumer(TOPIC, CHANNEL, [f"127.0.0.1:{port}"], message_handler=handler,
                             max_in_flight=MAX_IN_FLIGHT)
    consumer.start(block=False)
    while not done.wait(1) and not tally.stalled():
        pass
    gevent.sleep(0.5)       # time for the last FINs to go out
    consumer.close()
    consumer.join(5)
    return tally.report()


def consume_raw(port: int, expected: int) -> dict:
    """loadgen sub prefills and drains; it counts messages but keeps no ids."""
    out = subprocess.run([sys.executable, LOADGEN, "sub", "--port", str(port), "--topic", TOPIC,
                          "--channel", CHANNEL, "--messages", str(expected), "--size", str(SIZE),
                          "--rdy", str(MAX_IN_FLIGHT), "--output-buffer-timeout", "0"],
                         stdout=subprocess.PIPE, text=True, check=True, timeout=600)
    result = json.loads(out.stdout.splitlines()[-1])
    return {"received": result["messages"], "unique": None, "first": result["window_start"],
            "last": result["window_end"],
            "client_cpu_s": result["loadgen_cpu_pct"] * result["window_s"] / 100}


def consume_library(kind: str, port: int, expected: int) -> dict:
    """Prefill, then run a library consumer in a process of its own (this script)."""
    loadgen.prefill(loadgen.parse(["sub", "--port", str(port), "--topic", TOPIC, "--channel",
                                   CHANNEL, "--messages", str(expected), "--size", str(SIZE)]))
    out = subprocess.run([sys.executable, __file__, "--consume", kind, "--port", str(port),
                          "--messages", str(expected)],
                         stdout=subprocess.PIPE, text=True, check=True, timeout=600)
    return json.loads(out.stdout.splitlines()[-1])


def channel_stats(stack: Stack) -> dict:
    """The channel's counters once the broker has settled every FIN (or DRAIN_S passed)."""
    deadline = time.time() + DRAIN_S
    while True:
        stats = json.loads(stack.http(0, f"/stats?format=json&topic={TOPIC}"))
        channel = stats["topics"][0]["channels"][0]
        if channel["in_flight_count"] == 0 or time.time() > deadline:
            return channel
        time.sleep(0.1)


def problems(report: dict, channel: dict, expected: int) -> list:
    """What says a message was missed or delivered twice."""
    found = []
    if report["received"] != expected:
        found.append(f"received {report['received']} of {expected}")
    if report["unique"] is not None and report["unique"] != report["received"]:
        found.append(f"{report['received'] - report['unique']} duplicate ids")
    found += [f"channel {key} {channel[key]}" for key in
              ("depth", "in_flight_count", "deferred_count", "requeue_count", "timeout_count")
              if channel[key]]
    return found


def measure(kind: str, expected: int) -> dict:
    """One run of one client against a fresh stack; exits 1 if a message was lost or
    duplicated."""
    stack = Stack(1)
    try:
        sampler = CpuSampler({"broker": [stack.brokers[0].pid],
                              "redis": [p.pid for p in stack.redis_servers]})
        try:
            report = consume_raw(stack.tcp_port, expected) if kind == "raw" else \
                consume_library(kind, stack.tcp_port, expected)
        finally:
            sampler.stop()
        found = problems(report, channel_stats(stack), expected)
    finally:
        stack.stop()
    if found:
        print(f"clients_bench: {kind}: {'; '.join(found)}", file=sys.stderr)
        sys.exit(1)
    start, end = sampler.at(report["first"]), sampler.at(report["last"])
    cpu_s = {**{k: end[k] - start[k] for k in start}, "client": report["client_cpu_s"]}
    seconds = report["last"] - report["first"]
    return {"client": kind, "messages": report["received"], "seconds": round(seconds, 3),
            "msgs_per_s": round(expected / seconds),
            **{f"{k}_us_per_msg": round(1e6 * cpu_s[k] / expected, 2) for k in cpu_s}}


def spread(values: list) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def render(results: dict) -> str:
    """Markdown: per client, median rate with min and max, and median CPU µs per message
    (min–max)."""
    lines = ["| client | median msgs/s | min | max | messages | broker µs/msg | Redis µs/msg "
             "| client µs/msg |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kind, runs in results.items():
        rates = [r["msgs_per_s"] for r in runs]
        lines.append(f"| {kind} | {statistics.median(rates):,.0f} | {min(rates):,} | "
                     f"{max(rates):,} | {runs[0]['messages']:,} | "
                     + " | ".join(spread([r[f"{k}_us_per_msg"] for r in runs])
                                  for k in ("broker", "redis", "client")) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", nargs="+", choices=CLIENTS, default=CLIENTS)
    parser.add_argument("--consume", choices=["pynsq", "gnsq"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.consume:
        consume = consume_pynsq if args.consume == "pynsq" else consume_gnsq
        print(json.dumps(consume(args.port, args.messages)), flush=True)
        return
    results = {kind: [] for kind in args.clients}
    for _ in range(args.runs):      # clients take turns, so each sees the same machine
        for kind in args.clients:
            results[kind].append(measure(kind, args.messages))
            print(json.dumps(results[kind][-1]), flush=True)
    print(render(results))


if __name__ == "__main__":
    main()
