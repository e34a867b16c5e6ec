"""The console at scale (issue 49): the answer time of its overview with `--channels`
channels over `--topics` topics, the Redis CPU an open page costs (one browser, then
four, each polling the live overview every 2 s as the page does), and the slowest
answer a witness publishing every 20 ms got meanwhile, beside a quiet baseline.

A fresh stack (embedded Redis with conf/redis.conf, one broker, one scanner) and
`relay console` on it; the channels are made through the Store.

    .venv/bin/python -m scripts.bench_console [--topics 2000] [--channels 10000]
        [--polls 5] [--seconds 20]
"""

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import threading
import time

import redis

from relay import embedded
from scripts.bench import Stack
from scripts.bench_stats import make_channels, witness

POLL_S = 2.0    # what console.js waits between two fetches


def start_console(stack: Stack) -> tuple[subprocess.Popen, int]:
    port = embedded.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "relay", "console", "--console-address",
                             f"127.0.0.1:{port}"],
                            env={**os.environ, "REDIS_URL": stack.url,
                                 "RELAY_LOG_LEVEL": "warning"}, cwd=stack.dir)
    embedded.wait_for_port("127.0.0.1", port, proc)
    return proc, port


def get(conn: http.client.HTTPConnection, path: str) -> int:
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    assert response.status == 200, (response.status, body[:200])
    return len(body)


def overview_times(port: int, polls: int) -> tuple[list[float], int]:
    """Seconds of each GET / (each past the 1 s the console keeps its figures)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    times, size = [], 0
    for _ in range(polls):
        time.sleep(1.1)
        started = time.perf_counter()
        size = get(conn, "/")
        times.append(time.perf_counter() - started)
    return times, size


def browser(port: int, stop: threading.Event) -> None:
    """One open overview: its fragment fetched every POLL_S."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while not stop.wait(POLL_S):
        get(conn, "/live/overview")


def cpu_seconds(client: redis.Redis) -> float:
    info = client.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]


def process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_pages(stack: Stack, console: subprocess.Popen, port: int, browsers: int,
               seconds: float) -> dict:
    """Redis and console CPU per second, and the witness' slowest answer, while
    `browsers` pages are open (0: the quiet baseline)."""
    client = redis.Redis(port=stack.redis_ports[0])
    stop, slowest = threading.Event(), [0.0]
    threads = [threading.Thread(target=witness, args=(stack.tcp_port, stop, slowest))]
    threads += [threading.Thread(target=browser, args=(port, stop)) for _ in range(browsers)]
    redis_before, console_before = cpu_seconds(client), process_cpu(console.pid)
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return {"browsers": browsers,
            "redis_ms_per_s": (cpu_seconds(client) - redis_before) * 1000 / seconds,
            "console_ms_per_s": (process_cpu(console.pid) - console_before) * 1000 / seconds,
            "witness_slowest_ms": slowest[0] * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=2000)
    parser.add_argument("--channels", type=int, default=10_000)
    parser.add_argument("--polls", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    stack = Stack(1)
    console = None
    try:
        make_channels(stack.url, args.channels, args.topics)
        console, port = start_console(stack)
        times, size = overview_times(port, args.polls)
        print(f"overview of {args.topics:,} topics and {args.channels:,} channels: median "
              f"{statistics.median(times):.3f} s, slowest {max(times):.3f} s, {size:,} bytes",
              flush=True)
        print("| pages open | Redis CPU ms/s | console CPU ms/s | witness slowest ms |")
        print("| --- | --- | --- | --- |")
        for browsers in (0, 1, 4):
            r = open_pages(stack, console, port, browsers, args.seconds)
            print(f"| {r['browsers']} | {r['redis_ms_per_s']:.1f} | "
                  f"{r['console_ms_per_s']:.1f} | {r['witness_slowest_ms']:.1f} |", flush=True)
    finally:
        if console is not None:
            console.terminate()
            console.wait()
        stack.stop()


if __name__ == "__main__":
    main()
