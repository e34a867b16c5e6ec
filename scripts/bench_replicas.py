"""What --wait-replicas 1 costs against 0, on a local cluster of 3 masters with a replica
each (conf/redis.conf: AOF everysec, so the broker's wait is WAIT 1): the same workloads
with each setting alternately (0, 1, 0, 1 ...) in one run, with scripts/bench.py's Stack
and run_workload (a fresh cluster, broker and scanner each run; CPU over the timed
window).

    .venv/bin/python scripts/bench_replicas.py [--runs 3] [--seconds 5]
        [--only "pub P=1"] [--only "e2e 1x100"]

Prints a Markdown table: each run's msgs/s; the ratio wait 1 / wait 0, as the median of
each wait-1 run over the wait-0 run just before it; the medians of broker and Redis CPU
per message (Redis: the 6 servers together, replicas included) and of the e2e p99; and
messages published per WAIT (the group commit's pipelines per node that held a publish).
"""

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from scripts.bench import paired_ratio, settings_table  # noqa: E402

SETTINGS = {wait: {"cluster": 3, "broker_args": ("--wait-replicas", str(wait))}
            for wait in (0, 1)}


def per_wait(result: dict) -> str:
    """Messages published per WAIT call over the run ('-' without any)."""
    waits = result["redis_calls"].get("wait", 0)
    published = result.get("sent", result.get("messages"))
    return f"{published / waits:.1f}" if waits else "-"


def row(title: str, results: dict) -> str:
    def both(key: str, digits: int = 1) -> str:
        return " / ".join(f"{statistics.median(r[key] for r in results[w]):,.{digits}f}"
                          for w in SETTINGS)

    rates = [" / ".join(f"{r['msgs_per_s']:,.0f}" for r in results[w]) for w in SETTINGS]
    p99 = both("p99_ms", 2) if "p99_ms" in results[0][0] else ""
    waits = " / ".join(per_wait(r) for r in results[1])
    return (f"| {title} | {rates[0]} | {rates[1]} | {paired_ratio(results, 0, 1):.2f} | "
            f"{both('broker_us_per_msg')} | {both('redis_us_per_msg')} | {p99} | {waits} |")


def main():
    settings_table(__doc__.split("\n")[0],
                   ["workload", "wait 0 msgs/s", "wait 1 msgs/s", "wait 1 / wait 0",
                    "broker µs/msg 0 / 1", "Redis µs/msg 0 / 1", "p99 ms 0 / 1",
                    "msgs per WAIT (wait 1 runs)"],
                   SETTINGS, row)

if __name__ == "__main__":
    main()
