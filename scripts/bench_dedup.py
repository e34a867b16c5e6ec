"""Idempotent publish, measured (issue 39, relay/store/dedup.py): the MPUB rate of one
broker without keys (dedup off, nsqd's publish) and with a key per message and the
topic's dedup window on, in the same run, alternately (scripts/bench.py's Stack and
loadgen --keyed); then Redis bytes per remembered key (MEMORY USAGE of a part's dedup
set over its keys), beside what a HASH of key -> message id, to answer duplicates with
the id first published, would add. Prints Markdown for BENCHMARKS.md.

With --layouts, instead: Redis CPU per key of lib/dedup.lua's check and remember
alone (1,500 calls of 100 new keys a round), against the same without a set (the
keys split only) and against two time-bucket SETs (a layout not kept: a key is then
remembered between one window and two), alternately.

    .venv/bin/python scripts/bench_dedup.py [--runs 5] [--seconds 5] [--keys 100000]
    .venv/bin/python scripts/bench_dedup.py --layouts [--runs 5]
"""

import argparse
import os
import statistics
import sys
import uuid
from importlib import resources

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from relay.store import Store, keys  # noqa: E402
from relay.store.runner import with_includes  # noqa: E402
from scripts.bench import own_redis, paired_ratio, run_workload  # noqa: E402

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
    Store(redis.Redis.from_url(stack.url)).dedup.set_dedup(TOPIC, WINDOW_MS)


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
    with own_redis("dedup") as url:
        client = redis.Redis.from_url(url)
        store = Store(client)
        lines = [f"- Redis {client.info('server')['redis_version']}, {count:,} keys of each "
                 f"shape in one part:"]
        for shape, make in KEY_SHAPES.items():
            client.flushall()
            store.dedup.set_dedup(TOPIC, WINDOW_MS)
            made = [make(n) for n in range(count)]
            for i in range(0, count, 1000):
                store.dedup.publish_keyed(TOPIC, [b"x"] * len(made[i:i + 1000]), made[i:i + 1000])
            dedup = keys.dedup_key(TOPIC)
            per_key = client.memory_usage(dedup, samples=0) / client.zcard(dedup)
            client.hset("ids", mapping={k: "%016x" % n for n, k in enumerate(made)})
            per_id = client.memory_usage("ids", samples=0) / count
            lines.append(f"  - {shape}: dedup set (ZSET key -> expiry) {per_key:.0f} B per key; "
                         f"a HASH key -> message id beside it would add {per_id:.0f} B")
        return lines


# each layout's script: KEYS the set, the part meta, a second set; ARGV the keys joined
LAYOUTS = {
    "split only": b"""-- include: dedup.lua
local publish_keys = dedup_split(ARGV[1])
redis.call('HGET', KEYS[2], 'dedup_ms')
return #publish_keys""",
    "ZSET (lib/dedup.lua)": b"""-- include: dedup.lua
local publish_keys = dedup_split(ARGV[1])
local fresh, _, window = dedup_fresh(KEYS[2], KEYS[1], publish_keys)
dedup_remember(KEYS[1], window, publish_keys, fresh)
return #fresh""",
    "two SETs (not kept)": b"""-- include: dedup.lua
local publish_keys = dedup_split(ARGV[1])
local window = tonumber(redis.call('HMGET', KEYS[2], 'dedup_ms', 'dedup_from')[1])
local now, old = redis.call('SMISMEMBER', KEYS[1], unpack(publish_keys)),
                 redis.call('SMISMEMBER', KEYS[3], unpack(publish_keys))
local seen, fresh = {}, {}
for i, key in ipairs(publish_keys) do
  if not seen[key] and now[i] == 0 and old[i] == 0 then fresh[#fresh + 1] = key end
  seen[key] = true
end
redis.call('SADD', KEYS[1], unpack(fresh))
redis.call('PEXPIRE', KEYS[1], 2 * window)
return #fresh""",
}


def layouts(runs: int, calls: int = 1500, per_call: int = 100) -> list[str]:
    """A row per layout: Redis CPU (INFO used_cpu) per key of its script, one round of
    `calls` EVALSHAs of `per_call` new keys each after the other's; then bytes per key."""
    with own_redis("dedup") as url:
        client = redis.Redis.from_url(url)
        lib = resources.files("relay.store") / "scripts" / "lib"
        shas = {name: client.script_load(with_includes(lib, source, set()))
                for name, source in LAYOUTS.items()}
        client.hset("{t}:meta", "dedup_ms", WINDOW_MS)
        used: dict = {name: [] for name in LAYOUTS}
        made = 0
        for _ in range(runs):
            for name, sha in shas.items():
                pipe = client.pipeline(transaction=False)
                for _ in range(calls):
                    pipe.evalsha(sha, 3, f"{{t}}:{name}", "{t}:meta", f"{{t}}:{name}:old",
                                 " ".join(f"k-{n}" for n in range(made, made + per_call)))
                    made += per_call
                before = cpu_seconds(client)
                pipe.execute()
                used[name].append((cpu_seconds(client) - before) / (calls * per_call) * 1e6)
        rows = []
        for name in LAYOUTS:
            stored = client.memory_usage(f"{{t}}:{name}", samples=0)
            count = {b"zset": client.zcard, b"set": client.scard}.get(
                client.type(f"{{t}}:{name}"), lambda _: 0)(f"{{t}}:{name}")
            rows.append(f"| {name} | {' '.join(f'{x:.2f}' for x in used[name])} | "
                        f"{statistics.median(used[name]):.2f} | "
                        f"{f'{stored / count:.0f}' if count else '-'} |")
        return rows


def cpu_seconds(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--layouts", action="store_true",
                        help="Redis CPU per key of the dedup set's layouts, alone")
    args = parser.parse_args()
    if args.layouts:
        print("| layout | Redis µs per key, each round | median | bytes per key |")
        print("| --- | --- | --- | --- |")
        for row in layouts(args.runs):
            print(row, flush=True)
        return
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
