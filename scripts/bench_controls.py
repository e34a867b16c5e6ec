"""Issue 38's channel controls on the hot path, measured: the MPUB and consume rates of
one broker with each control set on the bench channel and unset, alternately in one run
(scripts/bench.py's Stack and loadgen), medians and paired ratios against "none".
CONTROLS names each control by the function that sets it on the bench topic/channel;
every setting creates the channel first, so MPUB always fans out to it. Then, as the
rates on a shared machine move by more than the cost looked for, the publish script's
own cost in Redis with each control: `INFO commandstats` µs per EVALSHA over blocks of
publish calls, the controls in turn. Prints Markdown for BENCHMARKS.md.

    .venv/bin/python scripts/bench_controls.py [--runs 5] [--seconds 5] [--only mpub]
        [--calls 2000]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from relay import embedded  # noqa: E402
from relay.store import Store  # noqa: E402
from relay.store.limits import Limit  # noqa: E402
from scripts.bench import alternately, paired_ratio  # noqa: E402

TOPIC, CHANNEL = "bench", "bench"
NEVER_REACHED = 1_000_000_000
REACHED = 10_000        # a limit each MPUB of 100 passes once the queue is full


def none(store: Store) -> None:
    store.create_channel(TOPIC, CHANNEL)


def limit(store: Store) -> None:
    """A depth limit never reached: the check alone."""
    none(store)
    store.set_limit(TOPIC, CHANNEL, Limit(NEVER_REACHED, "reject"))


def limit_reached(store: Store) -> None:
    """A depth limit drop-oldest keeps: each publish past it trims the queue."""
    none(store)
    store.set_limit(TOPIC, CHANNEL, Limit(REACHED, "drop-oldest"))


CONTROLS = {"none": none, "limit": limit, "limit reached, drop-oldest": limit_reached}

TARGET = ["--topic", TOPIC, "--channel", CHANNEL, "--size", "200"]
WORKLOADS = [
    ("mpub K=100 P=1, 200 B", ["mpub", "--producers", "1", "--batch", "100", *TARGET]),
    ("sub C=1 RDY 100, 200 B", ["sub", "--consumers", "1", "--rdy", "100",
                                "--messages", "200000", *TARGET]),
]


def prepare(control):
    """The Stack hook that sets `control` through the stack's Redis."""
    return lambda stack: control(Store(redis.Redis.from_url(stack.url)))


def rows(runs: int, seconds: float, only: list[str]) -> list[str]:
    """A table row per workload and control: msgs/s (median), its paired ratio to
    none, Redis µs per message (median)."""
    out = []
    for title, args in WORKLOADS:
        if only and not any(o in title for o in only):
            continue
        controls = CONTROLS if args[0] == "mpub" else {k: CONTROLS[k] for k in ("none", "limit")}
        results = alternately(args, 1, seconds, runs,
                              {name: {"prepare": prepare(f)} for name, f in controls.items()})
        for name in controls:
            rate = statistics.median(r["msgs_per_s"] for r in results[name])
            cpu = statistics.median(r["redis_us_per_msg"] for r in results[name])
            ratio = paired_ratio(results, "none", name)
            out.append(f"| {title} | {name} | {rate:,.0f} | {ratio:.2f} | {cpu} |")
            print(out[-1], flush=True)
    return out


def script_cost(calls: int, rounds: int = 5) -> list[str]:
    """A row per control: the median over `rounds` of Redis' µs per publish call (an
    MPUB of 100 bodies of 200 B), `calls` calls per control and round, on one embedded
    Redis of its own (conf/redis.conf), the controls in turn on topics of their own."""
    data = tempfile.mkdtemp(prefix="relay-bench-controls-")
    port = embedded.free_port()
    proc = embedded.start(port, data, os.path.join(os.path.dirname(HERE), "conf", "redis.conf"))
    try:
        client = redis.Redis(port=port)
        costs: dict[str, list[float]] = {name: [] for name in CONTROLS}
        for _ in range(rounds):
            for name, control in CONTROLS.items():
                client.flushall()
                store = Store(client)
                control(store)
                store.publish(TOPIC, [b"x" * 200] * 100)   # the script loaded
                client.config_resetstat()
                for _ in range(calls):
                    store.publish(TOPIC, [b"x" * 200] * 100)
                stats = client.info("commandstats")["cmdstat_evalsha"]
                costs[name].append(stats["usec_per_call"])
        base = statistics.median(costs["none"])
        return [f"| {name} | {statistics.median(c):.1f} | {statistics.median(c) / base:.3f} |"
                for name, c in costs.items()]
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--calls", type=int, default=2000,
                        help="publish calls per control and round of the script's cost")
    args = parser.parse_args()
    if args.runs:
        print("| workload | control | msgs/s | / none (paired) | Redis µs per msg |")
        print("| --- | --- | --- | --- | --- |", flush=True)
        rows(args.runs, args.seconds, args.only)
        print()
    print("| control | publish.lua, Redis µs per MPUB of 100 (median) | / none |")
    print("| --- | --- | --- |")
    print("\n".join(script_cost(args.calls)))


if __name__ == "__main__":
    main()
