"""`relay broker --workers N` against one worker: the same workloads alternately (1, N,
1, N ...) in one run, so both see the same machine, with scripts/bench.py's Stack and
run_workload (fresh embedded Redis and broker each run; CPU over the timed window).

    .venv/bin/python scripts/bench_workers.py [--workers 2] [--runs 3] [--seconds 5]
        [--only "sub C=4 RDY 100"] [--only "pub P=4"]

Prints a Markdown table: each run's msgs/s; the ratio, as the median of each N-worker
run over the 1-worker run just before it; the median CPU (percent of one core) of the
broker (parent and workers), Redis and the load generator; and the broker's CPU time
per message.
"""

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from scripts.bench import WORKLOADS, alternately, paired_ratio  # noqa: E402


def cpu_us_per_message(result: dict) -> float:
    """The broker's CPU time per message of a run, in µs."""
    return 10_000 * result["broker_cpu_pct"] / result["msgs_per_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", action="append", default=[],
                        help="workloads whose title contains this (repeatable)")
    args = parser.parse_args()
    counts = (1, args.workers)
    print(f"| workload | 1 worker msgs/s | {args.workers} workers msgs/s | ratio | broker CPU % "
          "| Redis CPU % | loadgen CPU % | broker CPU µs / msg |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for title, loadgen_args, brokers in WORKLOADS:
        if brokers != 1 or (args.only and not any(o in title for o in args.only)):
            continue
        runs = alternately(loadgen_args, 1, args.seconds, args.runs,
                           {n: {"workers": n} for n in counts})

        def median(n, key):
            return statistics.median(r[key] for r in runs[n])

        rates = [" / ".join(f"{r['msgs_per_s']:,.0f}" for r in runs[n]) for n in counts]
        cpu = [" / ".join(f"{median(n, key):.0f}" for n in counts)
               for key in ("broker_cpu_pct", "redis_cpu_pct", "loadgen_cpu_pct")]
        ratio = paired_ratio(runs, 1, args.workers)
        per_message = " / ".join(
            f"{statistics.median(map(cpu_us_per_message, runs[n])):.0f}" for n in counts)
        print(f"| {title} | {rates[0]} | {rates[1]} | {ratio:.2f} | {' | '.join(cpu)} | "
              f"{per_message} |", flush=True)


if __name__ == "__main__":
    main()
