"""How long an unpause holds Redis: a topic with --channels channels is paused, gets
--messages messages of 100 B in its backlog (MPUBs of 1,000), then is unpaused through
the Store (control.pause_topic, as relay-admin and /topic/unpause do), while another
client PINGs every millisecond. Prints the unpause's wall time (took_s), how many script calls it
took and the longest (SLOWLOG: a call's own time in Redis), and the slowest PING seen
meanwhile: what every other client of that Redis waited at worst. It flushes the
database it is given.

--first-channel instead publishes the messages to a topic with no channel, one in 1,000
at priority 5 (a backlog to sort into lists record by record), and times the first
channel's SUB (Store.subscribe) in the same way.

    .venv/bin/python scripts/bench_unpause.py --redis-url redis://127.0.0.1:6379/0 \
        [--messages 1000000] [--channels 2] [--first-channel]
"""

import argparse
import json
import os
import sys
import threading
import time

import redis

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from relay.store import Store  # noqa: E402


def unpause(url: str, messages: int, channels: int, first_channel: bool) -> dict:
    client = redis.Redis.from_url(url)
    client.flushdb()
    store = Store(client)
    if first_channel:
        channels = 1
        for start in range(0, messages, 1000):
            n = min(1000, messages - start)
            store.dedup.publish_keyed("backlog", [b"x" * 100] * n, None, 0, None,
                                      [0] * (n - 1) + [5])
    else:
        for c in range(channels):
            store.subscribe("backlog", f"c{c}", "bench")
        store.control.pause_topic("backlog", True)
        for start in range(0, messages, 1000):
            store.publish("backlog", [b"x" * 100] * min(1000, messages - start))
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 100_000)
    client.slowlog_reset()
    slowest, done = [0.0], threading.Event()

    def ping() -> None:
        other = redis.Redis.from_url(url)
        while not done.is_set():
            start = time.perf_counter()
            other.ping()
            slowest[0] = max(slowest[0], time.perf_counter() - start)
            time.sleep(0.001)

    pinger = threading.Thread(target=ping)
    pinger.start()
    time.sleep(0.2)
    start = time.perf_counter()
    if first_channel:
        store.subscribe("backlog", "c0", "bench")
    else:
        store.control.pause_topic("backlog", False)
    took = time.perf_counter() - start
    done.set()
    pinger.join()
    calls = [e for e in client.slowlog_get(100_000) if e["command"].startswith(b"FCALL")]
    client.config_set("slowlog-log-slower-than", 10_000)
    return {"messages": messages, "channels": channels, "first_channel": first_channel,
            "took_s": round(took, 2),
            "calls": len(calls),
            "longest_call_ms": round(max(e["duration"] for e in calls) / 1000, 1),
            "slowest_ping_ms": round(slowest[0] * 1000, 1)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--channels", type=int, default=2)
    parser.add_argument("--first-channel", action="store_true")
    args = parser.parse_args()
    print(json.dumps(unpause(args.redis_url, args.messages, args.channels,
                             args.first_channel)), flush=True)
