"""Where Redis spends its CPU per message in relay's scripts, from one Python process with
no broker in between: publish (MPUB batches of 100), deliver (batches of 100 into a
growing in-flight set) and finish (the same batches), each step's server CPU (INFO cpu,
user + sys) over its messages, and the commands the scripts ran inside (INFO
commandstats: EVALSHA's time includes theirs).

    .venv/bin/python scripts/redis_profile.py --redis-url redis://127.0.0.1:6379/0 \
        [--batches 1500] [--size 200]

Prints one JSON line: {"publish_us": .., "deliver_us": .., "finish_us": .., "commands":
{name: µs per message}}. It flushes the database it is given.
"""

import argparse
import json

import redis

from relay.codec import record_id
from relay.store import Store

BATCH = 100


def cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]


def profile(url: str, batches: int, size: int) -> dict:
    client = redis.Redis.from_url(url)
    client.flushdb()
    store, owner, body = Store(client), "profile:1", b"x" * size
    store.subscribe("profile", "c", "profile")
    client.config_resetstat()
    messages = batches * BATCH
    marks = [cpu(client)]
    for _ in range(batches):
        store.publish("profile", [body] * BATCH)
    marks.append(cpu(client))
    delivered = [store.deliver("profile", "c", [(owner, 600_000, BATCH)])[0]
                 for _ in range(batches)]
    marks.append(cpu(client))
    for records in delivered:
        store.finish("profile", "c", [(owner, record_id(r)) for r in records])
    marks.append(cpu(client))
    per_message = [round((b - a) * 1e6 / messages, 2) for a, b in zip(marks, marks[1:])]
    commands = {name.removeprefix("cmdstat_"): round(stats["usec"] / messages, 2)
                for name, stats in client.info("commandstats").items()
                if stats["usec"] / messages >= 0.01}
    return {"publish_us": per_message[0], "deliver_us": per_message[1],
            "finish_us": per_message[2], "commands": commands}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--batches", type=int, default=1500)
    parser.add_argument("--size", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(profile(args.redis_url, args.batches, args.size)), flush=True)
