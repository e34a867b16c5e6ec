"""Issue 38's controls on the hot path, measured: the MPUB and consume rates of one
broker with each control of CONTROLS set on the bench channel against none, in the same
run, alternately (scripts/bench.py's Stack and loadgen), medians of the runs and ratios
paired by round. A control is set so that it never acts (a TTL no message reaches): what
is measured is what checking it costs every message. Prints Markdown for BENCHMARKS.md.

    .venv/bin/python scripts/bench_controls.py [--runs 5] [--seconds 5] [--only TITLE-PART]
"""

import argparse
import os
import statistics
import sys

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from relay.store import Store  # noqa: E402
from scripts.bench import alternately, paired_ratio  # noqa: E402

TOPIC, CHANNEL = "bench", "bench"
SIZE = 200
# name -> what sets that control on the bench topic and channel; "none" is the base
CONTROLS = {
    "none": lambda store: None,
    "ttl": lambda store: store.set_ttl(TOPIC, None, 600_000),     # 10 min: none expires
}
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
        store.create_channel(TOPIC, CHANNEL)
        CONTROLS[control](store)
    return run


def row(title: str, results: dict) -> str:
    """msgs/s per control (medians), each against none (paired), Redis µs per message."""
    rates = [statistics.median(r["msgs_per_s"] for r in results[c]) for c in CONTROLS]
    cpu = [statistics.median(r["redis_us_per_msg"] for r in results[c]) for c in CONTROLS]
    ratios = [f"{paired_ratio(results, 'none', c):.3f}" for c in CONTROLS if c != "none"]
    return (f"| {title} | " + " | ".join(f"{r:,.0f}" for r in rates) + " | "
            + " | ".join(ratios) + " | " + " / ".join(str(c) for c in cpu) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", action="append", default=[],
                        help="workloads whose title contains this (repeatable)")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
