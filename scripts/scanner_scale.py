"""The scanner with 10,000 channels and 1,000,000 messages in flight (issue 3).

Against a fresh embedded Redis (conf/redis.conf) and one real `relay scanner`,
fills --topics x --channels channels with --messages in flight through relay's own
scripts (subscribe, publish, deliver in pipelines), then measures:

1. requeue lateness. Each channel's messages go in flight in batches of --batch,
   one deadline per batch; the batches of a channel are --window / batches apart
   from a random phase, so deadlines are uniform over the window, which starts
   --lead seconds after the in-flight step began. scan.lua PUBLISHes on the topic's
   wake channel when it moves messages (what brokers wait on); each wake-up is
   matched to the batches of that channel that were due, and lateness is the
   wake-up's arrival minus the deadline read back from the in-flight ZSET. Redis
   must run on this host: one clock for both, and its CPU is read from /proc.
2. idle cost: every message in flight again for an hour; scanner and Redis CPU
   over --idle-seconds.

Prints one JSON line.

    .venv/bin/python scripts/scanner_scale.py [--topics 1000 --channels 10
        --messages 1000000 --batch 10 --window 30 --idle-seconds 20] [--redis-url URL]
"""

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from relay.options import Options  # noqa: E402
from relay.store import Store  # noqa: E402
from relay.store.keys import ChannelKeys, TopicKeys  # noqa: E402
from scripts.bench import cpu_seconds, own_redis  # noqa: E402
from scripts.loadgen import percentile  # noqa: E402

OWNER = "scale:1"
CHUNK = 500


def run_chunked(store: Store, ops: list) -> list:
    """Ops in pipelines of CHUNK; the first failure stops the benchmark."""
    results = []
    for i in range(0, len(ops), CHUNK):
        results += store.run_many(ops[i:i + CHUNK])
    for r in results:
        if isinstance(r, Exception):
            raise r
    return results


def per_channel(client: redis.Redis, channels: list, command, key: str, *args,
                **kwargs) -> list:
    """One command on one key of every channel, pipelined."""
    results = []
    for i in range(0, len(channels), CHUNK):
        pipe = client.pipeline(transaction=False)
        for t, c in channels[i:i + CHUNK]:
            getattr(pipe, command)(getattr(ChannelKeys.of(t, c), key), *args, **kwargs)
        results += pipe.execute()
    return results


def put_in_flight(store: Store, channels: list, per_channel_count: int, batch: int,
                  first_ms: float, window_ms: float, rng: random.Random) -> None:
    """Deliver every queued message, batch by batch, with deadlines spread over the window."""
    batches = per_channel_count // batch
    step = window_ms / batches
    for i in range(0, len(channels), CHUNK):
        ops = []
        for t, c in channels[i:i + CHUNK]:
            start = first_ms + rng.uniform(0, step) - time.time() * 1000
            ops.append(store.deliver_op(t, c, [(OWNER, round(start + k * step), batch)
                                               for k in range(batches)]))
        run_chunked(store, ops)


def read_deadlines(client: redis.Redis, channels: list) -> dict:
    """(topic, channel) -> deque of [deadline ms, messages], earliest first."""
    zsets = per_channel(client, channels, "zrange", "inflight", 0, -1, withscores=True)
    return {ch: collections.deque(sorted(collections.Counter(int(s) for _, s in z).items()))
            for ch, z in zip(channels, zsets)}


def watch_requeues(pubsub, wake_topics: dict, pending: dict, total: int, timeout: float):
    """Lateness in ms of every message, matched from wake-ups, and the wake-ups that
    matched nothing (non-zero would mean a batch was matched to an earlier wake-up)."""
    lateness, stray, left = [], 0, total
    end = time.monotonic() + timeout
    while left and time.monotonic() < end:
        message = pubsub.get_message(timeout=1.0)
        if message is None or message["type"] != "pmessage":
            continue
        channel = message["data"].decode().partition("|")[2]  # "V|C" (lib/news.lua)
        if not channel:
            continue
        now_ms = time.time() * 1000
        due = pending[(wake_topics[message["channel"]], channel)]
        if not due or due[0][0] > now_ms:
            stray += 1
        while due and due[0][0] <= now_ms:
            deadline, count = due.popleft()
            lateness += [now_ms - deadline] * count
            left -= count
    return sorted(lateness), stray


def wait_for_requeues(client: redis.Redis, channels: list, total: int,
                      timeout: float = 10.0) -> int:
    """The channels' timeout_count, once it reaches `total` (or after `timeout`). A
    wake-up read late can match the next batch of its channel before the scanner has
    requeued it, so the last matches may come before the last requeues."""
    end = time.monotonic() + timeout
    while True:
        timeouts = sum(int(v or 0) for v in per_channel(client, channels, "hget", "meta",
                                                        "timeout_count"))
        if timeouts >= total or time.monotonic() > end:
            return timeouts
        time.sleep(0.05)


def settle(client: redis.Redis) -> None:
    """Wait out the AOF rewrite that a big write may start, so idle means idle."""
    time.sleep(2)
    while client.info("persistence")["aof_rewrite_in_progress"]:
        time.sleep(0.5)


def cpu_pct(pids: dict, seconds: float) -> dict:
    """Percent of one core each pid used over the next `seconds`."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {name: round(100 * (cpu_seconds(pid) - before[name]) / seconds, 2)
            for name, pid in pids.items()}


def measure(args, url: str, workdir: str) -> dict:
    client = redis.Redis.from_url(url)
    if client.dbsize():
        raise SystemExit(f"scanner_scale needs an empty database, {url} has keys")
    store = Store(client)
    topics = [f"t{i}" for i in range(args.topics)]
    channels = [(t, f"c{j}") for t in topics for j in range(args.channels)]
    per_channel_count = args.messages // len(channels)
    if per_channel_count * len(channels) != args.messages or per_channel_count % args.batch:
        raise SystemExit("--messages must split evenly into channels and --batch")
    env = {**os.environ, "REDIS_URL": url, "RELAY_LOG_LEVEL": "warning"}
    scanner = subprocess.Popen([sys.executable, "-m", "relay", "scanner",
                                "--queue-scan-interval", str(args.scan_interval),
                                "--queue-scan-limit", str(args.scan_limit)],
                               env=env, cwd=workdir)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        pubsub.psubscribe(TopicKeys.of("*").wake)
        wake_topics = {TopicKeys.of(t).wake.encode(): t for t in topics}
        pids = {"scanner": scanner.pid, "redis": client.info("server")["process_id"]}

        started = time.time()
        # channels with no consumer counted: a consumer of an unregistered broker id
        # would be reaped as a dead broker's (workers/reaper.py), its messages requeued
        run_chunked(store, [store.subscribe_op(t, c, "") for t, c in channels])
        body = b"x" * args.size
        run_chunked(store, [store.publish_op(t, [body] * per_channel_count) for t in topics])
        first_ms = time.time() * 1000 + args.lead * 1000
        put_in_flight(store, channels, per_channel_count, args.batch, first_ms,
                      args.window * 1000, random.Random(args.seed))
        fill_s = time.time() - started
        pending = read_deadlines(client, channels)
        margin_ms = min(d[0][0] for d in pending.values()) - time.time() * 1000
        if margin_ms <= 0:
            raise SystemExit(f"the fill took {fill_s:.1f} s, past the first deadline: "
                             "raise --lead")

        time.sleep(margin_ms / 1000)
        window_cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
        window_start = time.time()
        lateness, stray = watch_requeues(pubsub, wake_topics, pending, args.messages,
                                         args.lead + args.window + 60)
        elapsed = time.time() - window_start
        timeouts = wait_for_requeues(client, channels, args.messages)
        in_flight_left = sum(per_channel(client, channels, "zcard", "inflight"))
        queued = sum(per_channel(client, channels, "llen", "queue"))
        result = {
            "topics": args.topics, "channels": len(channels), "messages": args.messages,
            "size": args.size, "batch": args.batch, "window_s": args.window,
            "scan_interval_ms": args.scan_interval, "scan_limit": args.scan_limit,
            "fill_s": round(fill_s, 2), "first_deadline_after_fill_ms": round(margin_ms),
            "lateness_p50_ms": percentile(lateness, 0.5),
            "lateness_p99_ms": percentile(lateness, 0.99),
            "lateness_max_ms": round(lateness[-1], 3) if lateness else None,
            "matched": len(lateness), "stray_wakeups": stray,
            "requeued": timeouts, "in_flight_left": in_flight_left, "queued": queued,
            "due_entries_left": sum(client.zcard(TopicKeys.of(t).due) for t in topics),
            "all_requeued": timeouts == args.messages and in_flight_left == 0,
            **{f"{name}_window_cpu_pct": round(100 * (cpu_seconds(pid) - window_cpu[name])
                                               / elapsed, 2) for name, pid in pids.items()},
        }

        run_chunked(store, [store.deliver_op(t, c, [(OWNER, 3_600_000, per_channel_count)])
                            for t, c in channels])
        result["idle_in_flight"] = sum(per_channel(client, channels, "zcard", "inflight"))
        settle(client)
        idle = cpu_pct(pids, args.idle_seconds)
        result.update(idle_seconds=args.idle_seconds, scanner_idle_cpu_pct=idle["scanner"],
                      redis_idle_cpu_pct=idle["redis"])
        return result
    finally:
        pubsub.close()
        scanner.terminate()
        scanner.wait(10)


def parse(argv=None):
    defaults = Options()
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topics", type=int, default=1000)
    p.add_argument("--channels", type=int, default=10, help="per topic")
    p.add_argument("--messages", type=int, default=1_000_000, help="in flight, in total")
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--batch", type=int, default=10, help="messages sharing one deadline")
    p.add_argument("--lead", type=float, default=15.0,
                   help="seconds from the start of the in-flight step to the first deadline")
    p.add_argument("--window", type=float, default=30.0, help="seconds the deadlines span")
    p.add_argument("--idle-seconds", type=float, default=20.0)
    p.add_argument("--scan-interval", type=int, default=defaults.queue_scan_interval)
    p.add_argument("--scan-limit", type=int, default=defaults.queue_scan_limit)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--redis-url", default=None,
                   help="an empty database on this host (default: a fresh embedded Redis)")
    return p.parse_args(argv)


def main():
    args = parse()
    workdir = tempfile.mkdtemp(prefix="relay-scanner-scale-")
    if args.redis_url:
        print(json.dumps(measure(args, args.redis_url, workdir)), flush=True)
        return
    with own_redis("scanner-scale") as url:
        print(json.dumps(measure(args, url, workdir)), flush=True)


if __name__ == "__main__":
    main()
