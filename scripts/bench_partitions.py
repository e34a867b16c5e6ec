"""One topic with 1 partition against 3 (issue 19), through a broker on a local cluster of
3 masters with a replica each (scripts/bench.py's Stack): the same workloads with each
--topic-partitions alternately (1, 3, 1, 3 ...) in one run, CPU over the timed window.

    .venv/bin/python scripts/bench_partitions.py [--runs 3] [--seconds 5]
        [--only "pub P=4"] [--only "e2e 1x100"]

Prints a Markdown table: each run's msgs/s, the ratio 3 / 1 (the median of each 3-part
run over the 1-part run just before it), and the medians of broker and Redis CPU per
message (Redis: the 6 servers together).
"""

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from scripts.bench import paired_ratio, settings_table  # noqa: E402

SETTINGS = {n: {"cluster": 3, "broker_args": ("--topic-partitions", str(n))} for n in (1, 3)}


def row(title: str, results: dict) -> str:
    def medians(key: str) -> str:
        return " / ".join(f"{statistics.median(r[key] for r in results[n]):,.1f}"
                          for n in SETTINGS)

    rates = [" / ".join(f"{r['msgs_per_s']:,.0f}" for r in results[n]) for n in SETTINGS]
    return (f"| {title} | {rates[0]} | {rates[1]} | {paired_ratio(results, 1, 3):.2f} | "
            f"{medians('broker_us_per_msg')} | {medians('redis_us_per_msg')} |")


def main():
    settings_table(__doc__.split("\n")[0],
                   ["workload", "1 partition msgs/s", "3 partitions msgs/s", "3 / 1",
                    "broker µs/msg 1 / 3", "Redis µs/msg 1 / 3"],
                   SETTINGS, row)

if __name__ == "__main__":
    main()
