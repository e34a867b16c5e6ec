"""/stats at scale: the answer time of a broker's `GET /stats?format=json` with many
channels (issue 49 item 5), and the slowest answer a witness publishing every 20 ms got
meanwhile; with --before, a git revision's broker too, alternately on one machine.
With --pollers N, N clients then poll /stats for --seconds at once (issue 57 item 2):
how many polls were answered, and the witness' median and worst answer meanwhile;
with --nsqd, nsqd v1.3.0 (../shared/bin/nsq-1.3.0) on the same load in the same run.

A fresh stack per run (embedded Redis with conf/redis.conf, one broker, one scanner);
the channels are made through the Store, `--channels` of them over `--topics` topics
(on nsqd through its HTTP API), with one message published to each topic.

    .venv/bin/python -m scripts.bench_stats [--channels 5000] [--topics 1] [--before REV]
        [--runs 3] [--polls 5] [--pollers 4 --seconds 10] [--nsqd]
"""

import argparse
import http.client
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time

from relay import embedded
from relay.store import Store
from relay.store.connection import connect
from scripts.bench import Stack
from scripts.compare import checked_out
from scripts.loadgen import Conn, pub_command


def make_channels(url: str, channels: int, topics: int) -> None:
    store = Store(connect(url))
    for i in range(channels):
        store.subscribe(f"stats-{i % topics}", f"c{i}", "bench")
    for i in range(topics):     # a message in each channel; once made, not per channel
        store.publish(f"stats-{i}", [b"x"])


NSQD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
                    "shared", "bin", "nsq-1.3.0", "nsqd")


class Nsqd:
    """nsqd v1.3.0 on free ports in a temporary folder, with tcp_port and http_ports as
    Stack has them."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="nsqd-bench-")
        self.tcp_port, http = embedded.free_port(), embedded.free_port()
        self.http_ports = [http]
        self.proc = subprocess.Popen(
            [NSQD, "--tcp-address", f"127.0.0.1:{self.tcp_port}", "--http-address",
             f"127.0.0.1:{http}", "--data-path", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        embedded.wait_for_port("127.0.0.1", http, self.proc)

    def make_channels(self, channels: int, topics: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.http_ports[0], timeout=60)
        for i in range(topics):
            post(conn, f"/topic/create?topic=stats-{i}")
        for i in range(channels):
            post(conn, f"/channel/create?topic=stats-{i % topics}&channel=c{i}")
        for i in range(topics):
            post(conn, f"/pub?topic=stats-{i}", b"x")

    def stop(self) -> None:
        self.proc.kill()    # its clean exit writes every channel's metadata: seconds
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def post(conn: http.client.HTTPConnection, path: str, body: bytes = b"") -> None:
    conn.request("POST", path, body)
    response = conn.getresponse()
    response.read()
    assert response.status == 200, (path, response.status)


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


def witness(tcp_port: int, stop: threading.Event, slowest: list,
            answers: list | None = None) -> None:
    """PUB every 20 ms; the slowest answer's seconds into slowest[0], each one's into
    `answers`."""
    conn = Conn("127.0.0.1", tcp_port)
    while not stop.is_set():
        started = time.perf_counter()
        conn.sock.sendall(pub_command(b"witness", b"x"))
        conn.expect_ok()
        took = time.perf_counter() - started
        slowest[0] = max(slowest[0], took)
        if answers is not None:
            answers.append(took)
        time.sleep(0.02)


def poller(http_port: int, until: float, times: list) -> None:
    """GET /stats?format=json until `until` (monotonic), each answer's seconds into times."""
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=120)
    while time.monotonic() < until:
        started = time.perf_counter()
        conn.request("GET", "/stats?format=json")
        response = conn.getresponse()
        response.read()
        assert response.status == 200, response.status
        times.append(time.perf_counter() - started)


def pollers_run(stack, args) -> dict:
    """args.pollers clients polling /stats for args.seconds beside the witness."""
    answer_times(stack.http_ports[0], 1)
    stop, slowest, answers = threading.Event(), [0.0], []
    thread = threading.Thread(target=witness, args=(stack.tcp_port, stop, slowest, answers))
    thread.start()
    time.sleep(0.2)
    until, polls = time.monotonic() + args.seconds, [[] for _ in range(args.pollers)]
    threads = [threading.Thread(target=poller, args=(stack.http_ports[0], until, times))
               for times in polls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    thread.join()
    every = sorted(t for times in polls for t in times)
    return {"polls": len(every), "stats_median_s": statistics.median(every),
            "stats_max_s": every[-1], "witness_p50_ms": statistics.median(answers) * 1000,
            "witness_worst_ms": max(answers) * 1000,
            "witness_over_100ms": sum(a > 0.1 for a in answers), "witness_pubs": len(answers)}


def nsqd_run(args) -> dict:
    nsqd = Nsqd()
    try:
        nsqd.make_channels(args.channels, args.topics)
        return pollers_run(nsqd, args)
    finally:
        nsqd.stop()


def one_run(source: str | None, args) -> dict:
    stack = Stack(1, source=source)
    try:
        make_channels(stack.url, args.channels, args.topics)
        if args.pollers:
            return pollers_run(stack, args)
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
    parser.add_argument("--pollers", type=int, default=0,
                        help="clients polling /stats at once for --seconds")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--nsqd", action="store_true", help="nsqd on the same load too")
    args = parser.parse_args()
    with checked_out(args.before, "relay-stats-") as before:
        sources = {"after": None, **({args.before: before} if args.before else {})}
        results: dict = {name: [] for name in sources}
        for _ in range(args.runs):
            for name, source in sources.items():
                results[name].append(one_run(source, args))
                print(name, results[name][-1], flush=True)
            if args.nsqd:
                print("nsqd", nsqd_run(args), flush=True)
        if args.pollers:
            return
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
