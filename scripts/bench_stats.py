"""/stats at scale: the answer time of a broker's `GET /stats?format=json` with many
channels (issue 49 item 5), and the slowest answer a witness publishing every 20 ms got
meanwhile; with --before, a git revision's broker too, alternately on one machine.

A fresh stack per run (embedded Redis with conf/redis.conf, one broker, one scanner);
the channels are made through the Store, `--channels` of them over `--topics` topics.

    .venv/bin/python -m scripts.bench_stats [--channels 5000] [--topics 1] [--before REV]
        [--runs 3] [--polls 5]
"""

import argparse
import http.client
import statistics
import threading
import time

from relay.store import Store
from relay.store.connection import connect
from scripts.bench import Stack
from scripts.compare import checked_out
from scripts.loadgen import Conn, pub_command


def make_channels(url: str, channels: int, topics: int) -> None:
    store = Store(connect(url))
    for i in range(channels):
        store.subscribe(f"stats-{i % topics}", f"c{i}", "bench")
        if i % topics == 0:
            store.publish(f"stats-{i % topics}", [b"x"])


def answer_times(http_port: int, polls: int) -> tuple[list[float], int]:
    """The seconds of each poll of /stats?format=json, and its size in bytes."""
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=120)
    times, size = [], 0
    for _ in range(polls):
        started = time.perf_counter()
        conn.request("GET", "/stats?format=json")
        response = conn.getresponse()
        size = len(response.read())
        assert response.status == 200, response.status
        times.append(time.perf_counter() - started)
    return times, size


def witness(tcp_port: int, stop: threading.Event, slowest: list) -> None:
    """PUB every 20 ms; the slowest answer's seconds into slowest[0]."""
    conn = Conn("127.0.0.1", tcp_port)
    while not stop.is_set():
        started = time.perf_counter()
        conn.sock.sendall(pub_command(b"witness", b"x"))
        conn.expect_ok()
        slowest[0] = max(slowest[0], time.perf_counter() - started)
        time.sleep(0.02)


def one_run(source: str | None, args) -> dict:
    stack = Stack(1, source=source)
    try:
        make_channels(stack.url, args.channels, args.topics)
        answer_times(stack.http_ports[0], 1)    # the broker's first look at every topic
        stop, slowest = threading.Event(), [0.0]
        thread = threading.Thread(target=witness, args=(stack.tcp_port, stop, slowest))
        thread.start()
        time.sleep(0.2)
        times, size = answer_times(stack.http_ports[0], args.polls)
        stop.set()
        thread.join()
        return {"median_s": statistics.median(times), "max_s": max(times), "bytes": size,
                "witness_slowest_ms": slowest[0] * 1000}
    finally:
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--channels", type=int, default=5000)
    parser.add_argument("--topics", type=int, default=1)
    parser.add_argument("--before", help="a git revision to measure alternately")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--polls", type=int, default=5)
    args = parser.parse_args()
    with checked_out(args.before, "relay-stats-") as before:
        sources = {"after": None, **({args.before: before} if args.before else {})}
        results: dict = {name: [] for name in sources}
        for _ in range(args.runs):
            for name, source in sources.items():
                results[name].append(one_run(source, args))
                print(name, results[name][-1], flush=True)
    print("| broker | /stats median s | slowest s | bytes | witness slowest ms |")
    print("| --- | --- | --- | --- | --- |")
    for name, runs in results.items():
        print(f"| {name} | " + " | ".join(
            f"{min(r[k] for r in runs):.3g}-{max(r[k] for r in runs):.3g}"
            for k in ("median_s", "max_s")) + f" | {runs[0]['bytes']:,} | "
            f"{min(r['witness_slowest_ms'] for r in runs):.0f}-"
            f"{max(r['witness_slowest_ms'] for r in runs):.0f} |")


if __name__ == "__main__":
    main()
