"""Issue 38's controls on the hot path, measured: the MPUB and consume rates of one
broker with each control of CONTROLS set on the bench channel against none, in the same
run, alternately (scripts/bench.py's Stack and loadgen), medians of the runs and ratios
paired by round. A control is set so that it never acts (a TTL no message reaches): what
is measured is what checking it costs every message. Then, as the rates of a shared
machine move by more than the cost looked for, publish.lua's own cost in Redis with each
control (and with a depth limit that drop-oldest keeps): `INFO commandstats` µs per
FCALL over blocks of MPUB calls, the controls' blocks in turn on one Redis. Prints Markdown
for BENCHMARKS.md.

With --sweep N, instead: the scanner's sweep of expired messages (expire.lua) over a
channel holding N expired messages and 1,000 live ones, dropped and dead-lettered: the
calls it takes and how long each holds Redis (SLOWLOG: the script's own time).
--no-aof turns Redis's AOF off for it: an AOF rewrite (a fork) makes the calls that
write while it runs pay copy-on-write.

    .venv/bin/python scripts/bench_controls.py [--runs 5] [--seconds 5] [--only TITLE-PART]
        [--calls 4000]
    .venv/bin/python scripts/bench_controls.py --sweep 1000000 [--no-aof]
"""

import argparse
import os
import statistics
import sys
import time

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from relay.store import Store  # noqa: E402
from relay.store.limits import Limit  # noqa: E402
from scripts.bench import alternately, own_redis, paired_ratio  # noqa: E402

TOPIC, CHANNEL = "bench", "bench"
SIZE = 200
# name -> what sets that control on the bench topic and channel; "none" is the base
CONTROLS = {
    "none": lambda store: None,
    "ttl": lambda store: store.expiry.set_ttl(TOPIC, None, 600_000),     # 10 min: none expires
    "limit": lambda store: store.limits.set_limit(TOPIC, CHANNEL,        # a depth never reached
                                           Limit(1_000_000_000, "reject")),
}
# publish.lua's cost only: a limit every MPUB of 100 passes once the queue holds 10,000,
# so each trims 100 (a consume of a prefilled queue cannot run with it)
COST_CONTROLS = {**CONTROLS, "limit reached, drop-oldest": lambda store: store.limits.set_limit(
    TOPIC, CHANNEL, Limit(10_000, "drop-oldest"))}
WORKLOADS = [
    ("mpub K=100 P=1, 200 B", ["mpub", "--producers", "1", "--batch", "100"]),
    ("sub C=1 RDY 100, 200 B", ["sub", "--consumers", "1", "--rdy", "100",
                                "--messages", "200000"]),
    ("sub C=4 RDY 1, 200 B", ["sub", "--consumers", "4", "--rdy", "1", "--messages", "40000"]),
]


def prepare(control: str):
    """The bench channel made, then `control` set on it, before the load starts."""
    def run(stack) -> None:
        store = Store(redis.Redis.from_url(stack.url))
        store.control.create_channel(TOPIC, CHANNEL)
        CONTROLS[control](store)
    return run


def row(title: str, results: dict) -> str:
    """msgs/s per control (medians), each against none (paired), Redis µs per message."""
    rates = [statistics.median(r["msgs_per_s"] for r in results[c]) for c in CONTROLS]
    cpu = [statistics.median(r["redis_us_per_msg"] for r in results[c]) for c in CONTROLS]
    ratios = [f"{paired_ratio(results, 'none', c):.3f}" for c in CONTROLS if c != "none"]
    return (f"| {title} | " + " | ".join(f"{r:,.0f}" for r in rates) + " | "
            + " | ".join(ratios) + " | " + " / ".join(str(c) for c in cpu) + " |")


def script_cost(calls: int, blocks: int = 20) -> list[str]:
    """A row per control of COST_CONTROLS: Redis' µs per publish call (an MPUB of 100
    bodies of SIZE), the median over `blocks` blocks of calls / blocks calls each. Every
    control has a database of its own on one embedded Redis (conf/redis.conf) and the
    blocks alternate between them, so the machine's drift falls on all alike."""
    with own_redis("controls") as url:
        stores = {}
        for db, (name, control) in enumerate(COST_CONTROLS.items()):
            stores[name] = Store(redis.Redis.from_url(url, db=db))
            stores[name].control.create_channel(TOPIC, CHANNEL)
            control(stores[name])
            stores[name].publish(TOPIC, [b"x" * SIZE] * 100)     # the script loaded
        costs: dict[str, list[float]] = {name: [] for name in COST_CONTROLS}
        for _ in range(blocks):
            for name, store in stores.items():
                store.redis.config_resetstat()
                for _ in range(calls // blocks):
                    store.publish(TOPIC, [b"x" * SIZE] * 100)
                costs[name].append(store.redis.info("commandstats")["cmdstat_fcall"]
                                   ["usec_per_call"])
        base = statistics.median(costs["none"])
        return [f"| {name} | {statistics.median(c):.1f} | {statistics.median(c) / base:.3f} |"
                for name, c in costs.items()]


def sweep_cost(count: int, aof: bool = True) -> list[str]:
    """A row per way expired messages go (dropped; dead-lettered: the scanner's max
    attempts 3): `count` messages published two hours ago in MPUBs of 100 and 1,000
    new ones, a TTL of 10 min, then expire.lua calls until none is left to do."""
    rows = []
    with own_redis("sweep") as url:
        store = Store(redis.Redis.from_url(url))
        if not aof:
            store.redis.config_set("appendonly", "no")
        for way, max_attempts in (("dropped", 0), ("dead-lettered", 3)):
            store.redis.flushall()
            store.control.create_channel(TOPIC, CHANNEL)
            old = time.time_ns() - 7_200_000_000_000
            for i in range(0, count, 10_000):
                store.run_many([store.publish_op(TOPIC, [b"x" * SIZE] * 100, timestamp_ns=old)
                                for _ in range(min(10_000, count - i) // 100)])
            store.publish(TOPIC, [b"x" * SIZE] * 1000)
            store.expiry.set_ttl(TOPIC, None, 600_000)
            store.run(store.expiry.expire_op("none"))      # the script loaded: not timed
            store.redis.config_set("slowlog-log-slower-than", 0)
            store.redis.config_set("slowlog-max-len", 100_000)
            store.redis.slowlog_reset()
            expired, calls, more = 0, 0, True
            while more:
                expired_now, more = store.run(store.expiry.expire_op(TOPIC, max_attempts))
                expired, calls = expired + expired_now, calls + 1
            store.redis.config_set("slowlog-log-slower-than", 10_000)
            times = [e["duration"] / 1000 for e in store.redis.slowlog_get(100_000)
                     if b"FCALL" in e["command"].upper()]
            times.sort()
            rows.append(f"| {way} | {expired:,} | {calls} | {sum(times):.0f} | "
                        f"{times[len(times) // 2]:.2f} / {times[len(times) * 99 // 100]:.2f} / "
                        f"{times[-1]:.1f} | {expired / sum(times) * 1000:,.0f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", action="append", default=[],
                        help="workloads whose title contains this (repeatable)")
    parser.add_argument("--calls", type=int, default=4000,
                        help="MPUB calls per control of publish.lua's cost")
    parser.add_argument("--sweep", type=int, default=0,
                        help="measure the sweep of this many expired messages instead")
    parser.add_argument("--no-aof", action="store_true",
                        help="with --sweep: Redis without its AOF (no rewrite's fork)")
    args = parser.parse_args()
    if args.sweep:
        print("| expired messages | taken out | expire.lua calls | Redis ms in all | "
              "a call's ms: median / p99 / longest | messages per Redis second |")
        print("| --- | --- | --- | --- | --- | --- |")
        print("\n".join(sweep_cost(args.sweep, aof=not args.no_aof)))
        return
    others = [c for c in CONTROLS if c != "none"]
    print("| workload | " + " | ".join(f"{c}, msgs/s" for c in CONTROLS) + " | "
          + " | ".join(f"{c} / none (paired)" for c in others)
          + " | Redis µs per msg, " + " / ".join(CONTROLS) + " |")
    print("|" + " --- |" * (2 + len(CONTROLS) + len(others)))
    for title, loadgen_args in WORKLOADS:
        if args.only and not any(o in title for o in args.only):
            continue
        results = alternately([*loadgen_args, "--topic", TOPIC, "--channel", CHANNEL,
                               "--size", str(SIZE)], 1, args.seconds, args.runs,
                              {c: {"prepare": prepare(c)} for c in CONTROLS})
        print(row(title, results), flush=True)
    print("\n| control | publish.lua, Redis µs per MPUB of 100 (median) | / none |")
    print("| --- | --- | --- |")
    print("\n".join(script_cost(args.calls)))


if __name__ == "__main__":
    main()
