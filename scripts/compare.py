"""Before/after: the same workloads against the brokers of two git revisions, run
alternately (before, after, before, after ...) so both see the same machine. Prints
each run's rate, the median CPU per message and (e2e workloads) the median p99.

Each revision is checked out into a temporary git worktree and its brokers and
scanner run from there (PYTHONPATH); Redis, the load generator and the harness are
this checkout's (scripts/bench.py's Stack and run_workload).

    .venv/bin/python scripts/compare.py BEFORE_REV AFTER_REV [--runs 3] [--seconds 5]
        [--only "pub P=4"] [--only "e2e 1x100"]
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from scripts.bench import WORKLOADS, alternately  # noqa: E402


def checkout(rev: str, parent: str) -> str:
    path = os.path.join(parent, rev.replace("/", "_"))
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", path, rev],
                   check=True)
    old_layout = os.path.join(path, "relay", "workers")
    if not os.path.exists(old_layout):  # revisions before a4ea050 import it as relay.workers
        os.symlink(os.path.join(path, "workers"), old_layout)
    return path


@contextlib.contextmanager
def checked_out(rev: str | None, prefix: str, source: str | None = None):
    """The checkout to run from: `rev` in a temporary worktree, removed after; without a
    rev, `source` or this checkout."""
    if not rev:
        yield source or ROOT
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as parent:
        path = checkout(rev, parent)
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", path])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", action="append", default=[],
                        help="workloads whose title contains this (repeatable; default all)")
    args = parser.parse_args()
    if args.before == args.after:
        parser.error("BEFORE and AFTER name the same revision")
    workloads = [w for w in WORKLOADS if not args.only or any(o in w[0] for o in args.only)]
    with checked_out(args.before, "relay-compare-") as before, \
            checked_out(args.after, "relay-compare-") as after:
        compare({args.before: before, args.after: after}, workloads, args)


def compare(sources: dict, workloads: list, args) -> None:
    """Print the table's rows, one workload at a time."""
    print(f"| workload | {args.before} msgs/s | {args.after} msgs/s | after / before "
          "| broker µs/msg before / after | Redis µs/msg before / after "
          "| p99 ms before / after |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for title, loadgen_args, brokers in workloads:
        runs = alternately(loadgen_args, brokers, args.seconds, args.runs,
                           {rev: {"source": source} for rev, source in sources.items()})
        rate, cost = {}, {}
        for rev, results in runs.items():
            rate[rev] = statistics.median(r["msgs_per_s"] for r in results)
            cost[rev] = {k: statistics.median(r[f"{k}_us_per_msg"] for r in results)
                         for k in ("broker", "redis")}
        cells = [" / ".join(f"{r['msgs_per_s']:,.0f}" for r in runs[rev]) for rev in sources]
        before, after = args.before, args.after
        p99 = " / ".join(f"{statistics.median(r['p99_ms'] for r in runs[rev]):.2f}"
                         if "p99_ms" in runs[rev][0] else "-" for rev in sources)
        print(f"| {title} | {cells[0]} | {cells[1]} | {rate[after] / rate[before]:.2f} | "
              + " | ".join(f"{cost[before][k]:.1f} / {cost[after][k]:.1f}"
                           for k in ("broker", "redis")) + f" | {p99} |", flush=True)


if __name__ == "__main__":
    main()
