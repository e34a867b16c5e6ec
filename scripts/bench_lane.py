"""The CPU of the group commit's Redis path alone: pipelines of K one-message publishes
run by ScriptRunner.run_many on a dedicated Store (the broker's lane connection), in a
process of their own, as CPU µs per op (the process's time: its send and recv
syscalls' included). The figure moves with the runner's code more than with the load of
a shared machine, so it shows a change of a few µs that a whole broker's noise hides.
With --before REV, that revision's code runs alternately, against the same embedded
Redis.

    .venv/bin/python -m scripts.bench_lane [--before REV] [--ops 1 2 8] [--rounds 3]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PIPELINES = 2000


def child(url: str, ops: int) -> None:
    """Print the CPU µs per op of PIPELINES pipelines of `ops` publishes (after one to
    load the scripts and register the topic; the topic registry's SADD, which a broker
    sends every few seconds, is left out of the ops timed)."""
    from gevent import monkey
    monkey.patch_all()
    from relay.store.connection import connect
    from relay.store.store import Store
    store = Store(connect(url, 5.0), True)
    pipeline = [store.publish_op("lane-bench", [b"x" * 100]) for _ in range(ops)]
    store.run_many(pipeline)
    pipeline = [op._replace(pre=()) for op in pipeline]
    started = time.process_time()
    for _ in range(PIPELINES):
        store.run_many(pipeline)
    print(1e6 * (time.process_time() - started) / (PIPELINES * ops))


def measure(source: str, url: str, ops: int) -> float:
    env = {**os.environ, "PYTHONPATH": source}
    out = subprocess.run([sys.executable, os.path.join(HERE, "bench_lane.py"), "--child",
                          url, str(ops)], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="a git revision to measure alternately")
    parser.add_argument("--ops", type=int, nargs="+", default=[1, 2, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    sys.path.insert(0, ROOT)
    from scripts.bench import own_redis
    from scripts.compare import checked_out
    with own_redis("lane") as url, checked_out(args.before, "relay-bench-lane-") as before:
        sources = {"this checkout": ROOT, **({args.before: before} if args.before else {})}
        print("| ops per pipeline | " + " | ".join(f"{name} µs/op" for name in sources) + " |")
        print("| --- |" + " --- |" * len(sources))
        for ops in args.ops:
            figures: dict = {name: [] for name in sources}
            for _ in range(args.rounds):
                for name, source in sources.items():
                    figures[name].append(measure(source, url, ops))
            print(f"| {ops} | " + " | ".join(f"{statistics.median(f):.1f}"
                                             for f in figures.values()) + " |", flush=True)


if __name__ == "__main__":
    main()
