"""Retention and replay, measured (docs/replay.md): the MPUB rate of one broker with
retention off and on (--retention-time 1h) in the same run, alternately (scripts/bench.py's
Stack and loadgen); Redis bytes per retained message (MEMORY USAGE of the history stream
over its entries, next to the record's size); the replay rate of all of it into a
channel (workers/operations.py, as relay-admin runs it inline); and the cost of trimming
all of it by time in one call. Prints Markdown for BENCHMARKS.md.

    .venv/bin/python scripts/bench_retention.py [--runs 3] [--seconds 5] [--messages 1000000]
"""

import argparse
import os
import statistics
import sys
import time

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from relay.codec import RECORD_HEADER  # noqa: E402
from relay.store import Store  # noqa: E402
from relay.store.keys import TopicKeys  # noqa: E402
from scripts import loadgen  # noqa: E402
from scripts.bench import Stack, alternately, paired_ratio  # noqa: E402
from workers import operations  # noqa: E402

SIZE = 200
RETENTION = ("--retention-time", "1h")
WORKLOADS = [("mpub K=100 P=1, 200 B", ["mpub", "--producers", "1", "--batch", "100",
                                        "--size", str(SIZE)]),
             ("mpub K=100 P=2, 200 B", ["mpub", "--producers", "2", "--batch", "100",
                                        "--size", str(SIZE)])]


def publish_rates(runs: int, seconds: float) -> list[str]:
    """A table row per workload: msgs/s off and on (medians), their paired ratio, Redis
    CPU per message."""
    rows = []
    for title, args in WORKLOADS:
        results = alternately(args, 1, seconds, runs,
                              {"off": {}, "on": {"broker_args": RETENTION}})
        off, on = (statistics.median(r["msgs_per_s"] for r in results[k]) for k in ("off", "on"))
        cpu = [statistics.median(r["redis_us_per_msg"] for r in results[k]) for k in ("off", "on")]
        rows.append(f"| {title} | {off:,.0f} | {on:,.0f} | {paired_ratio(results, 'off', 'on'):.2f}"
                    f" | {cpu[0]} / {cpu[1]} |")
    return rows


def memory_and_replay(count: int) -> dict:
    """`count` messages of SIZE published through a broker with retention on (MPUB of
    100), to a topic with one channel; then the history's bytes per entry, the replay of
    all of it into a second channel, and its trim by time."""
    stack = Stack(1, broker_args=RETENTION)
    try:
        client = redis.Redis.from_url(stack.url)
        store = Store(client)
        producer = loadgen.Conn("127.0.0.1", stack.tcp_port)
        producer.sock.sendall(b"SUB kept first\n")
        producer.expect_ok()
        publisher = loadgen.Conn("127.0.0.1", stack.tcp_port)
        for i in range(0, count, 100):
            publisher.sock.sendall(loadgen.mpub_command(b"kept", [b"x" * SIZE] *
                                                        min(100, count - i)))
            publisher.expect_ok()
        history = TopicKeys.of("kept").history
        entries = client.xlen(history)
        usage = client.memory_usage(history, samples=0)
        store.subscribe("kept", "again", "")
        started = time.monotonic()
        replayed = operations.run(store, "replay", "kept", "again",
                                  params={"starts": ["-"]})["replayed"]
        replay_s = time.monotonic() - started
        store.redis.hset(TopicKeys.of("kept").meta, "retention_ms", 1)
        started = time.monotonic()
        trimmed = store.run(store.trim_op("kept"))[0]
        trim_s = time.monotonic() - started
        return {"entries": entries, "record": SIZE + RECORD_HEADER + 1,
                "bytes_per_entry": usage / entries, "replayed": replayed,
                "replay_per_s": replayed / replay_s, "replay_s": replay_s,
                "trimmed": trimmed, "trim_ms": trim_s * 1000,
                "redis_version": client.info("server")["redis_version"]}
    finally:
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--messages", type=int, default=1_000_000)
    args = parser.parse_args()
    print("| workload | retention off, msgs/s | on, msgs/s | on / off (paired) | "
          "Redis µs per msg, off / on |")
    print("| --- | --- | --- | --- | --- |")
    for row in publish_rates(args.runs, args.seconds):
        print(row, flush=True)
    m = memory_and_replay(args.messages)
    print()
    print(f"- Redis {m['redis_version']}: {m['entries']:,} messages of {SIZE} B retained; "
          f"MEMORY USAGE of the stream / entries = {m['bytes_per_entry']:.1f} B per message, "
          f"{m['bytes_per_entry'] / m['record']:.2f}x the {m['record']} B record")
    print(f"- replay of {m['replayed']:,} messages into a channel: {m['replay_s']:.1f} s, "
          f"{m['replay_per_s']:,.0f} msgs/s")
    print(f"- trim by time of {m['trimmed']:,} entries in one call (XTRIM MINID): "
          f"{m['trim_ms']:.0f} ms")


if __name__ == "__main__":
    main()
