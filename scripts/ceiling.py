"""What Redis itself can do for relay's work, measured from one Python process with no
broker and no client sockets in between:

- `scripts`: relay's own Lua scripts in batches of 100, one call per step, as the
  broker would send them, for each kind of work a workload does: `publish` only (what
  PUB/MPUB cost), `consume` only (deliver to in-flight, then finish, from a filled
  channel: what a sub workload costs) and the whole `loop` (publish -> deliver ->
  finish: what e2e costs);
- `plain`: a plain Redis queue baseline for the same three: RPUSH 100 (`publish`),
  LPOP 100 from a filled list (`consume`), both in turn (`loop`).

Prints one JSON line per measurement:
{"ceiling": "scripts"|"plain", "work": "publish"|"consume"|"loop", "msgs_per_s": N,
 "redis_us_per_msg": the server's CPU (INFO cpu, user + sys) over the messages}.

    .venv/bin/python scripts/ceiling.py --redis-url redis://127.0.0.1:6379/0 [--seconds 5]
"""

import argparse
import json
import time

import redis

from relay.codec import record_id
from relay.store import Store

BATCH = 100


def scripts(store: Store, seconds: float, size: int) -> dict:
    """msgs/s of each kind of work through relay's scripts."""
    owner, body = "ceiling:1", b"x" * size
    store.subscribe("ceiling-split", "c", "ceiling")
    store.subscribe("ceiling", "c", "ceiling")

    def publish():
        store.publish("ceiling-split", [body] * BATCH)
        return BATCH

    def consume():
        records = store.deliver("ceiling-split", "c", [(owner, 60_000, BATCH)])[0]
        store.finish("ceiling-split", "c", [(owner, record_id(r)) for r in records])
        return len(records)

    def loop():
        store.publish("ceiling", [body] * BATCH)
        records = store.deliver("ceiling", "c", [(owner, 60_000, BATCH)])[0]
        store.finish("ceiling", "c", [(owner, record_id(r)) for r in records])
        return len(records)

    client = store.redis
    return {"publish": _rate(publish, seconds, client),
            "consume": _rate(consume, seconds, client), "loop": _rate(loop, seconds, client)}


def plain(client: redis.Redis, seconds: float, size: int) -> dict:
    """msgs/s of the same work on a plain Redis list."""
    body = b"x" * size

    def publish():
        client.rpush("ceiling:plain-split", *([body] * BATCH))
        return BATCH

    def consume():
        return len(client.lpop("ceiling:plain-split", BATCH) or [])

    def loop():
        client.rpush("ceiling:plain", *([body] * BATCH))
        return len(client.lpop("ceiling:plain", BATCH))

    return {"publish": _rate(publish, seconds, client),
            "consume": _rate(consume, seconds, client), "loop": _rate(loop, seconds, client)}


def _cpu(client: redis.Redis) -> float:
    """The server's CPU seconds so far (user + sys)."""
    info = client.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]


def _rate(step, seconds: float, client: redis.Redis) -> tuple[float, float]:
    """Messages per second of `step` (returns how many it did) for `seconds`, or until
    it does nothing (a consume that emptied what publish filled), and the server's CPU
    µs per message meanwhile."""
    done, end = 0, time.perf_counter() + seconds
    cpu, start = _cpu(client), time.perf_counter()
    while time.perf_counter() < end:
        n = step()
        if not n:
            break
        done += n
    elapsed, used = time.perf_counter() - start, _cpu(client) - cpu
    return done / elapsed, used * 1e6 / max(done, 1)


def measure(url: str, seconds: float, size: int) -> list[dict]:
    client = redis.Redis.from_url(url)
    out = []
    for name, rates in (("scripts", scripts(Store(client), seconds, size)),
                        ("plain", plain(client, seconds, size))):
        out += [{"ceiling": name, "work": work, "size": size, "msgs_per_s": round(rate),
                 "redis_us_per_msg": round(us, 2)} for work, (rate, us) in rates.items()]
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=200)
    args = parser.parse_args()
    for line in measure(args.redis_url, args.seconds, args.size):
        print(json.dumps(line), flush=True)
