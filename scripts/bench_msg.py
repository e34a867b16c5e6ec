"""`relay-admin msg` on a big channel, measured (issue 38): a fresh embedded Redis
(conf/redis.conf), one channel of --messages queued messages of 100 B, the first 100
delivered (in flight, held by an owner the registry does not announce, so found by a
ZSCAN) and one deferred; then the wall time of `relay-admin msg` (in this process,
through click, as a user runs it minus Python's start) for a message in each place, and
of the relay-admin process for one. Prints Markdown for BENCHMARKS.md.

    .venv/bin/python scripts/bench_msg.py [--messages 1000000] [--runs 5]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

from click.testing import CliRunner

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from relay import admin  # noqa: E402
from relay.store import Store  # noqa: E402
from relay.store.connection import connect  # noqa: E402
from scripts.bench import own_redis  # noqa: E402

BATCH = 1000
BODY = b"x" * 100
RELAY_ADMIN = os.path.join(os.path.dirname(sys.executable), "relay-admin")


def fill(store: Store, count: int) -> dict[str, str]:
    """t/c with `count` queued messages, 100 in flight and one deferred: the id of a
    message in each place."""
    store.subscribe("t", "c", "")
    for start in range(0, count, BATCH):
        store.publish("t", [BODY] * min(BATCH, count - start))
    store.deliver("t", "c", [("bench:1", 3_600_000, 100)])
    last = store.publish("t", [BODY], defer_ms=3_600_000)
    finished = count + 2
    store.publish("t", [BODY])
    store.deliver("t", "c", [("bench:2", 60_000, 1)], max_attempts=0)  # head: 101
    store.finish("t", "c", [("bench:2", b"%016x" % 101)])
    return {"in flight": "%016x" % 50, "deferred": "%016x" % last,
            "queued, position 1": "%016x" % 102,
            f"queued, position {count // 2:,}": "%016x" % (101 + count // 2),
            f"queued, position {count - 100:,} (the last)": "%016x" % finished,
            "finished (not there: a full scan)": "%016x" % 101}


def timed(url: str, msg_id: str, runs: int) -> float:
    """Median seconds of `relay-admin msg t ID` run through click in this process."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = CliRunner().invoke(admin.main, ["--redis-url", url, "msg", "t", msg_id])
        times.append(time.perf_counter() - start)
        assert result.exit_code == 0, result.output
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with own_redis("msg") as url:
        store = Store(connect(url))
        start = time.perf_counter()
        ids = fill(store, args.messages)
        print(f"filled t/c with {args.messages:,} messages in {time.perf_counter() - start:.0f} s\n")
        print("| message | msg, median of %d (s) |\n| --- | --- |" % args.runs)
        for where, msg_id in ids.items():
            print(f"| {where} | {timed(url, msg_id, args.runs):.3f} |")
        start = time.perf_counter()
        subprocess.run([RELAY_ADMIN, "--redis-url", url, "msg", "t", ids["in flight"]],
                       check=True, capture_output=True)
        print(f"\nthe relay-admin process for the one in flight: "
              f"{time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
