"""What Redis itself can do for relay's work, measured from one Python process with no
broker and no client sockets in between:

- `scripts`: relay's own Lua scripts in batches of 100 (publish -> deliver to
  in-flight -> finish), one pipeline per step, as the broker would send them;
- `plain`: a plain Redis queue baseline, RPUSH 100 then LPOP 100.

Prints one JSON line per measurement: {"ceiling": "scripts"|"plain", "msgs_per_s": N}.

    .venv/bin/python scripts/ceiling.py --redis-url redis://127.0.0.1:6379/0 [--seconds 5]
"""

import argparse
import json
import time

import redis

from relay.codec import record_id
from relay.store import Store

BATCH = 100


def scripts(store: Store, seconds: float, size: int) -> float:
    topic, channel, owner = "ceiling", "c", "ceiling:1"
    store.subscribe(topic, channel, "ceiling")
    body = b"x" * size
    done, end = 0, time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        store.publish(topic, [body] * BATCH)
        records = store.deliver(topic, channel, [(owner, 60_000, BATCH)])[0]
        store.finish(topic, channel, [(owner, record_id(r)) for r in records])
        done += len(records)
    return done / (time.perf_counter() - start)


def plain(client: redis.Redis, seconds: float, size: int) -> float:
    body = b"x" * size
    done, end = 0, time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        client.rpush("ceiling:plain", *([body] * BATCH))
        done += len(client.lpop("ceiling:plain", BATCH))
    return done / (time.perf_counter() - start)


def measure(url: str, seconds: float, size: int) -> list[dict]:
    client = redis.Redis.from_url(url)
    return [{"ceiling": "scripts", "size": size,
             "msgs_per_s": round(scripts(Store(client), seconds, size))},
            {"ceiling": "plain", "size": size,
             "msgs_per_s": round(plain(client, seconds, size))}]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=200)
    args = parser.parse_args()
    for line in measure(args.redis_url, args.seconds, args.size):
        print(json.dumps(line), flush=True)
