"""Idempotent publish, measured (issue 39, relay/store/dedup.py): the MPUB rate of one
broker without keys (dedup off, nsqd's publish) and with a key per message and the
topic's dedup window on, in the same run, alternately (scripts/bench.py's Stack and
loadgen --keyed); then Redis bytes per remembered key (MEMORY USAGE of a part's dedup
set over its keys), beside what a HASH of key -> message id, to answer duplicates with
the id first published, would add. Prints Markdown for BENCHMARKS.md.

    .venv/bin/python scripts/bench_dedup.py [--runs 5] [--seconds 5] [--keys 100000]
"""

import argparse
import os
import statistics
import sys
import tempfile
import uuid

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from relay import embedded  # noqa: E402
from relay.store import Store, keys  # noqa: E402
from scripts.bench import ROOT, paired_ratio, run_workload  # noqa: E402

TOPIC = "dedup-bench"
WINDOW_MS = 600_000
WORKLOADS = [("mpub K=100 P=1, 200 B", ["mpub", "--producers", "1", "--batch", "100",
                                        "--size", "200", "--topic", TOPIC]),
             ("mpub K=100 P=2, 200 B", ["mpub", "--producers", "2", "--batch", "100",
                                        "--size", "200", "--topic", TOPIC])]
# the keys of a Spark stream's rows, and short ones as the loadgen's
KEY_SHAPES = {"Spark sink, 45 B": lambda n: f"{uuid.uuid4()}:7:0:{n}".encode(),
              "short, 8-12 B": lambda n: b"k-%d" % n}


def window_on(stack) -> None:
    Store(redis.Redis.from_url(stack.url)).set_dedup(TOPIC, WINDOW_MS)


def publish_rates(runs: int, seconds: float) -> list[str]:
    """A table row per workload: msgs/s off and on (medians), their paired ratio, broker
    and Redis CPU per message."""
    settings = {"off": ([], {}), "on": (["--keyed"], {"prepare": window_on})}
    rows = []
    for title, args in WORKLOADS:
        results: dict = {name: [] for name in settings}
        for _ in range(runs):
            for name, (more, kwargs) in settings.items():
                results[name].append(run_workload(args + more, 1, seconds, **kwargs))
        rate = {k: statistics.median(r["msgs_per_s"] for r in results[k]) for k in settings}
        cpu = {k: [statistics.median(r[f"{who}_us_per_msg"] for r in results[k])
                   for who in ("broker", "redis")] for k in settings}
        rows.append(f"| {title} | {rate['off']:,.0f} | {rate['on']:,.0f} | "
                    f"{paired_ratio(results, 'off', 'on'):.2f} | "
                    f"{cpu['off'][0]} / {cpu['on'][0]} | {cpu['off'][1]} / {cpu['on'][1]} |")
    return rows


def bytes_per_key(count: int) -> list[str]:
    """`count` keys of each shape remembered in one part's dedup set (publish_keyed, 1,000
    a call); MEMORY USAGE of the set over its keys, and of a HASH key -> 16-hex id."""
    port = embedded.free_port()
    server = embedded.start(port, tempfile.mkdtemp(prefix="relay-bench-dedup-"),
                            os.path.join(ROOT, "conf", "redis.conf"))
    try:
        client = redis.Redis(port=port)
        store = Store(client)
        lines = [f"- Redis {client.info('server')['redis_version']}, {count:,} keys of each "
                 f"shape in one part:"]
        for shape, make in KEY_SHAPES.items():
            client.flushall()
            store.set_dedup(TOPIC, WINDOW_MS)
            made = [make(n) for n in range(count)]
            for i in range(0, count, 1000):
                store.publish_keyed(TOPIC, [b"x"] * len(made[i:i + 1000]), made[i:i + 1000])
            dedup = keys.dedup_key(TOPIC)
            per_key = client.memory_usage(dedup, samples=0) / client.zcard(dedup)
            client.hset("ids", mapping={k: "%016x" % n for n, k in enumerate(made)})
            per_id = client.memory_usage("ids", samples=0) / count
            lines.append(f"  - {shape}: dedup set (ZSET key -> expiry) {per_key:.0f} B per key; "
                         f"a HASH key -> message id beside it would add {per_id:.0f} B")
        return lines
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args()
    print("| workload | no keys, msgs/s | keyed, window on, msgs/s | on / off (paired) | "
          "broker µs per msg, off / on | Redis µs per msg, off / on |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in publish_rates(args.runs, args.seconds):
        print(row, flush=True)
    print()
    for line in bytes_per_key(args.keys):
        print(line)


if __name__ == "__main__":
    main()
