"""Retention and replay, measured (docs/replay.md): the MPUB rate of one broker with
retention off, on (--retention-time 1h: the history only grows) and on trimming
(--retention-time 1s: the history at its retention, trimming what expires)
in the same run, alternately (scripts/bench.py's Stack and loadgen); the Redis time of
publish.lua per message off and on, bodies of one size and of sizes all different (INFO
commandstats, through the Store); Redis bytes per retained message (MEMORY USAGE of the
history stream over the messages it holds, next to the record's size), for MPUBs of 100
(an entry each) and for PUBs (an entry per message); the replay rate of all of it into a
channel (workers/operations.py, as relay-admin runs it inline); and the cost of trimming
all of it by time (trim.lua calls of a bounded cost, as the scanner and relay-admin
retention make them; SLOWLOG's time of each). Prints Markdown for BENCHMARKS.md.

    .venv/bin/python scripts/bench_retention.py [--runs 3] [--seconds 5] [--messages 1000000]
        [--pubs 1000000]
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
from relay.store.keys import ChannelKeys, TopicKeys  # noqa: E402
from scripts import loadgen  # noqa: E402
from scripts.bench import Stack, alternately, own_redis, paired_ratio  # noqa: E402
from workers import operations  # noqa: E402

SIZE = 200
RETENTION = ("--retention-time", "1h")
TRIMMING = ("--retention-time", "1s")
BENCH_CLIENT = "bench-retention"    # its calls, in SLOWLOG (the Stack's scanner trims too)
WORKLOADS = [("mpub K=100 P=1, 200 B", ["mpub", "--producers", "1", "--batch", "100",
                                        "--size", str(SIZE)]),
             ("mpub K=100 P=2, 200 B", ["mpub", "--producers", "2", "--batch", "100",
                                        "--size", str(SIZE)])]


def publish_rates(runs: int, seconds: float) -> list[str]:
    """A table row per workload: msgs/s off, on (a history that only grows) and on
    trimming (--retention-time 1s: from the second second on, the history is at its
    retention, and the publishes trim what expires, every 10 ms: 1% of it), medians; the
    paired ratios to off; Redis CPU per message."""
    rows = []
    settings = {"off": {}, "on": {"broker_args": RETENTION},
                "trimming": {"broker_args": TRIMMING}}
    for title, args in WORKLOADS:
        results = alternately(args, 1, seconds, runs, settings)
        rate = {k: statistics.median(r["msgs_per_s"] for r in results[k]) for k in settings}
        cpu = [statistics.median(r["redis_us_per_msg"] for r in results[k]) for k in settings]
        rows.append(f"| {title} | {rate['off']:,.0f} | {rate['on']:,.0f} | "
                    f"{paired_ratio(results, 'off', 'on'):.2f} | {rate['trimming']:,.0f} | "
                    f"{paired_ratio(results, 'off', 'trimming'):.2f} | "
                    f"{' / '.join(str(c) for c in cpu)} |")
    return rows


def script_cost(runs: int, calls: int = 2000) -> list[str]:
    """Redis µs per message inside publish.lua (commandstats of FCALL: the script's own
    time, no I/O), MPUBs of 100 to a topic with one channel, retention off and on in turn,
    bodies of SIZE B and of SIZE/2..3*SIZE/2 B (each length different in a call): a
    table row per kind of bodies, medians of `runs` (on - off: of the paired
    differences)."""
    rows = []
    with own_redis("retention") as url:
        client = redis.Redis.from_url(url)
        store = Store(client)
        for topic in ("off", "on"):
            store.subscribe(topic, "c", "")
        store.history.set_retention("on", 3_600_000, 0)
        kinds = [(f"{SIZE} B each", [b"x" * SIZE] * 100),
                 (f"{SIZE // 2}-{SIZE * 3 // 2 - 1} B, all different",
                  [b"x" * (SIZE // 2 + i) for i in range(100)])]
        for title, bodies in kinds:
            us: dict[str, list[float]] = {"off": [], "on": []}
            for _ in range(runs):
                for topic in ("off", "on"):
                    ops = [store.publish_op(topic, bodies) for _ in range(50)]
                    before = client.info("commandstats")["cmdstat_fcall"]["usec"]
                    for _ in range(calls // 50):
                        store.run_many(ops)
                    spent = client.info("commandstats")["cmdstat_fcall"]["usec"] - before
                    us[topic].append(spent / (calls * 100))
                    client.delete(TopicKeys.of(topic).history, ChannelKeys.of(topic, "c").queue)
            off, on = statistics.median(us["off"]), statistics.median(us["on"])
            more = statistics.median(b - a for a, b in zip(us["off"], us["on"]))
            rows.append(f"| {title} | {off:.2f} | {on:.2f} | {more:+.2f} |")
    return rows


def trim_all(store: Store, topic: str) -> dict:
    """Retention cut to 1 ms: trim.lua calls until none is left to trim; the time each
    held Redis (SLOWLOG: the command's own time, no round trip; this client's only)."""
    client = store.redis
    store.redis.hset(TopicKeys.of(topic).meta, "retention_ms", 1)
    store.run(store.history.trim_op("none"))    # the script loaded: its compilation is not timed
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 100_000)
    client.slowlog_reset()
    trimmed = calls = 0
    while True:
        step = store.run(store.history.trim_op(topic))
        trimmed, calls = trimmed + step.trimmed, calls + 1
        if not step.more:
            break
    client.config_set("slowlog-log-slower-than", 10_000)
    times = [e["duration"] / 1000 for e in client.slowlog_get(100_000)
             if e["command"].startswith(b"FCALL")
             and e["client_name"] == BENCH_CLIENT.encode()]
    assert len(times) == calls, (len(times), calls)
    return {"trimmed": trimmed, "calls": calls, "trim_ms": sum(times),
            "longest_ms": max(times)}


def memory_and_replay(count: int) -> dict:
    """`count` messages of SIZE published through a broker with retention on (MPUB of
    100), to a topic with one channel; then the history's bytes per message, the replay
    of all of it into a second channel, and its trim by time."""
    stack = Stack(1, broker_args=RETENTION)
    try:
        client = redis.Redis.from_url(stack.url, client_name=BENCH_CLIENT)
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
        messages = store.history.retained("kept")[0].entries
        usage = client.memory_usage(history, samples=0)
        store.subscribe("kept", "again", "")
        started = time.monotonic()
        replayed = operations.run(store, "replay", "kept", "again",
                                  params={"starts": ["-"]})["replayed"]
        replay_s = time.monotonic() - started
        stack.scanner.terminate()   # its sweep would trim the history too
        stack.scanner.wait(10)
        return {"messages": messages, "entries": client.xlen(history),
                "record": SIZE + RECORD_HEADER + 1, "bytes_per_message": usage / messages,
                "replayed": replayed, "replay_per_s": replayed / replay_s,
                "replay_s": replay_s, **trim_all(store, "kept"),
                "redis_version": client.info("server")["redis_version"]}
    finally:
        stack.stop()


def single_pubs(count: int) -> dict:
    """`count` messages of SIZE, a publish call each (PUB: an entry each), through the
    Store into a Redis of conf/redis.conf: bytes per message, and the trim by time."""
    with own_redis("retention") as url:
        client = redis.Redis.from_url(url, client_name=BENCH_CLIENT)
        store = Store(client)
        store.subscribe("single", "c", "")
        store.history.set_retention("single", 3_600_000, 0)
        for i in range(0, count, 1000):
            store.run_many([store.publish_op("single", [b"x" * SIZE])
                            for _ in range(min(1000, count - i))])
        messages = store.history.retained("single")[0].entries
        usage = client.memory_usage(TopicKeys.of("single").history, samples=0)
        return {"messages": messages, "bytes_per_message": usage / messages,
                **trim_all(store, "single")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--pubs", type=int, default=1_000_000)
    args = parser.parse_args()
    print("| workload | retention off, msgs/s | on, msgs/s | on / off (paired) | "
          "on, trimming, msgs/s | trimming / off (paired) | Redis µs per msg, off / on / "
          "trimming |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in publish_rates(args.runs, args.seconds):
        print(row, flush=True)
    print()
    print("| MPUB of 100, bodies | publish.lua µs per msg, off | on | on - off |")
    print("| --- | --- | --- | --- |")
    for row in script_cost(max(args.runs, 7)):
        print(row, flush=True)
    m = memory_and_replay(args.messages)
    print()
    print(f"- Redis {m['redis_version']}: {m['messages']:,} messages of {SIZE} B retained "
          f"(MPUBs of 100: {m['entries']:,} entries); MEMORY USAGE of the stream / messages = "
          f"{m['bytes_per_message']:.1f} B per message, "
          f"{m['bytes_per_message'] / m['record']:.2f}x the {m['record']} B record")
    print(f"- replay of {m['replayed']:,} messages into a channel: {m['replay_s']:.1f} s, "
          f"{m['replay_per_s']:,.0f} msgs/s")
    print(f"- trim by time of {m['trimmed']:,} messages ({m['entries']:,} entries): "
          f"{m['calls']} trim.lua calls holding Redis {m['trim_ms']:.1f} ms in all, the "
          f"longest {m['longest_ms']:.1f} ms")
    if args.pubs:
        p = single_pubs(args.pubs)
        print(f"- {p['messages']:,} PUBs of {SIZE} B (an entry each): "
              f"{p['bytes_per_message']:.1f} B per message, "
              f"{p['bytes_per_message'] / m['record']:.2f}x the record; their trim by time: "
              f"{p['calls']} trim.lua calls holding Redis {p['trim_ms']:.1f} ms in all, the "
              f"longest {p['longest_ms']:.1f} ms")


if __name__ == "__main__":
    main()
