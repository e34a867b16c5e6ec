"""What an idle deployment costs Redis, whatever the number of topics (issue 35 item 4).

Starts an embedded Redis (no persistence), one broker and one scanner, as
scripts/idle_latency.py starts its broker, subscribes one consumer (a raw socket
speaking NSQ V2: SUB, RDY 1) to each of `--topics` topics, waits `--warmup` seconds,
then reads Redis' INFO over `--seconds`: the commands it ran (total_commands_processed,
which counts the commands inside scripts too, less the INFO calls that read it), the
share of one core it used (used_cpu_user + used_cpu_sys), the commands by name, and
the broker's and scanner's CPU. Nothing is published: the only traffic is what idle
brokers and scanners send. `--rev REV` runs the broker and scanner of another git
revision (a temporary worktree, as scripts/compare.py does; PYTHONPATH), `--source DIR`
those of a checkout already there. Prints one JSON line.

    .venv/bin/python scripts/idle_cost.py [--topics 2000] [--warmup 15] [--seconds 10]
        [--rev REV | --source DIR]
"""

import argparse
import json
import os
import resource
import selectors
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import redis  # noqa: E402

from relay import embedded  # noqa: E402
from scripts.compare import checked_out  # noqa: E402
from scripts.idle_latency import Connection, cpu_seconds  # noqa: E402


def subscribe_all(port: int, topics: int) -> tuple[list, selectors.BaseSelector]:
    """One consumer per topic, each at RDY 1, once every SUB was answered OK."""
    selector = selectors.DefaultSelector()
    consumers = []
    for i in range(topics):
        consumer = Connection(port, f"idle{i}", "c")
        consumers.append(consumer)
        selector.register(consumer.sock, selectors.EVENT_READ, consumer)
    subscribed = 0
    while subscribed < len(consumers):
        events = selector.select(30)
        if not events:
            raise SystemExit(f"only {subscribed} of {topics} consumers subscribed")
        for key, _ in events:
            for kind, data in key.data.frames():
                if (kind, data) != (0, b"OK"):
                    raise SystemExit(f"unexpected frame {kind} {data!r}")
                subscribed += 1
    return consumers, selector


def keep_alive(selector: selectors.BaseSelector, seconds: float) -> None:
    """Wait, answering heartbeats (Connection.frames does); nothing else may arrive."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        for key, _ in selector.select(left):
            for frame in key.data.frames():
                raise SystemExit(f"an idle consumer got {frame!r}")


def redis_counts(client: redis.Redis) -> dict:
    stats = client.info("all")
    return {"commands": stats["total_commands_processed"],
            "info": stats.get("cmdstat_info", {}).get("calls", 0),
            "cpu": stats["used_cpu_user"] + stats["used_cpu_sys"],
            "by_name": {k[len("cmdstat_"):]: v["calls"] for k, v in stats.items()
                        if k.startswith("cmdstat_")}}


def measure(client: redis.Redis, selector, pids: dict, args) -> dict:
    keep_alive(selector, args.warmup)
    before = redis_counts(client)
    cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
    start = time.monotonic()
    keep_alive(selector, args.seconds)
    elapsed = time.monotonic() - start
    after = redis_counts(client)
    commands = (after["commands"] - before["commands"]) - (after["info"] - before["info"])
    by_name = {name: round((calls - before["by_name"].get(name, 0)) / elapsed, 1)
               for name, calls in after["by_name"].items() if name != "info"}
    return {"topics": args.topics, "seconds": round(elapsed, 1),
            "redis_commands_per_s": round(commands / elapsed, 1),
            "redis_cpu_pct": round(100 * (after["cpu"] - before["cpu"]) / elapsed, 2),
            "commands_per_s_by_name": {k: v for k, v in sorted(by_name.items()) if v},
            **{f"{name}_cpu_pct": round(100 * (cpu_seconds(pid) - cpu[name]) / elapsed, 2)
               for name, pid in pids.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=2000)
    parser.add_argument("--warmup", type=float, default=15.0,
                        help="seconds between the last SUB and the measurement")
    parser.add_argument("--seconds", type=float, default=10.0)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--rev", help="run the broker and scanner of this git revision")
    which.add_argument("--source", help="run the broker and scanner of this checkout")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with checked_out(args.rev, "relay-idle-cost-src-", args.source) as source:
        result = run(source, args)
    print(json.dumps({**result, "revision": args.rev or args.source or "this checkout"}))


def run(source: str, args) -> dict:
    """A Redis, a broker and a scanner of `source`, the consumers; the measurement."""
    redis_port, tcp_port = embedded.free_port(), embedded.free_port()
    data = tempfile.mkdtemp(prefix="relay-idle-cost-")
    redis_proc = embedded.start(redis_port, data, extra=("--save", "", "--appendonly", "no"))
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
           "PYTHONPATH": source, "RELAY_LOG_LEVEL": "warning"}
    procs = {}
    try:
        procs["broker"] = subprocess.Popen(
            [sys.executable, "-m", "relay", "broker", "--tcp-address",
             f"127.0.0.1:{tcp_port}", "--http-address", ""],
            env=env, stderr=open(os.path.join(data, "broker.log"), "w"), cwd=source)
        procs["scanner"] = subprocess.Popen(
            [sys.executable, "-m", "relay", "scanner"],
            env=env, stderr=open(os.path.join(data, "scanner.log"), "w"), cwd=source)
        embedded.wait_for_port("127.0.0.1", tcp_port, procs["broker"])
        client = redis.Redis(port=redis_port)
        consumers, selector = subscribe_all(tcp_port, args.topics)
        try:
            result = measure(client, selector, {n: p.pid for n, p in procs.items()}, args)
        except BaseException:
            print(f"the logs: {data}", file=sys.stderr)
            raise
        for consumer in consumers:
            consumer.sock.close()
        return result
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(30)
        redis_proc.terminate()
        redis_proc.wait(10)


if __name__ == "__main__":
    main()
