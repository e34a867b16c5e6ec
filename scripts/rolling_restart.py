"""A rolling restart (SIGHUP) of `relay broker --workers N` under steady publishing: a
measurement, not a test.

    .venv/bin/python scripts/rolling_restart.py [--workers 4] [--rate 1000] [--tcp 4]
        [--http 2] [--restarts 1]

Starts an embedded Redis (or uses REDIS_URL) and `relay broker --workers N` on free
ports, then publishes one message per request at --rate msgs/s in all: --tcp producers
on one NSQ connection each, which behave as pynsq's do (a connection that closes or
fails is opened again and what it had not acknowledged is sent again), and --http
producers POSTing /pub on a keep-alive connection, opened again the same way. After 2 s
it sends SIGHUP, waits until every worker is a new process, publishes 2 s more, then
reads the topic's channel to the end and prints:

- acknowledged: messages a producer got OK for;
- lost: acknowledged but never delivered (must be 0);
- duplicates: delivered more than once (a resend of a message whose OK the closed
  connection did not carry);
- refused: connection attempts refused or reset (before anything was sent on them);
- reconnects: connections the broker closed under a producer (a worker draining);
- longest publish gap: the longest time, in ms, one producer waited between two OKs.
"""

import argparse
import http.client
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from relay import embedded  # noqa: E402

TOPIC, CHANNEL = "rolling", "c"
REFUSED = (ConnectionRefusedError, ConnectionResetError)


class Producer(threading.Thread):
    """Publishes `rate` msgs/s, one at a time, until stopped; reconnects as pynsq does."""

    def __init__(self, name: str, port: int, rate: float, kind: str):
        super().__init__(daemon=True)
        self.name, self.port, self.interval, self.kind = name, port, 1 / rate, kind
        self.acked: list[bytes] = []
        self.refused = self.reconnects = self.resends = 0
        self.longest_gap = 0.0
        self.running = True
        self.conn: Any = None       # a socket, or an HTTPConnection

    def run(self) -> None:
        n, due, last_ok = 0, time.monotonic(), time.monotonic()
        while self.running:
            body = f"{self.name}-{n}".encode()
            n += 1
            sent = False
            while self.running:     # until acknowledged: resend on a new connection
                if self.conn is None:
                    try:
                        self.conn = self._connect()
                    except REFUSED:
                        self.refused += 1
                        time.sleep(0.01)
                        continue
                try:
                    if sent:
                        self.resends += 1
                    sent = True
                    self._publish(body)
                    break
                except (OSError, EOFError, http.client.HTTPException):
                    self.reconnects += 1
                    self._drop()
            else:
                return
            now = time.monotonic()
            self.acked.append(body)
            self.longest_gap = max(self.longest_gap, now - last_ok)
            last_ok = now
            due += self.interval
            if due > now:
                time.sleep(due - now)

    def _connect(self):
        if self.kind == "http":
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            conn.connect()
            return conn
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(b"  V2")
        return sock

    def _publish(self, body: bytes) -> None:
        if self.kind == "http":
            self.conn.request("POST", f"/pub?topic={TOPIC}", body)
            response = self.conn.getresponse()
            if (response.status, response.read()) != (200, b"OK"):
                raise OSError(f"HTTP {response.status}")
            return
        self.conn.sendall(b"PUB %s\n" % TOPIC.encode() + struct.pack(">i", len(body)) + body)
        while True:
            size, frame_type = struct.unpack(">ii", exact(self.conn, 8))
            data = exact(self.conn, size - 4)
            if data != b"_heartbeat_":
                break
            self.conn.sendall(b"NOP\n")
        if (frame_type, data) != (0, b"OK"):
            raise OSError(f"answer {frame_type} {data!r}")

    def _drop(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
        self.conn = None


def exact(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("closed")
        data += chunk
    return data


def children(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return {int(p) for p in f.read().split()}


def consume(port: int, expected: int, idle: float = 3.0) -> list[bytes]:
    """Every message on the channel, FINed, until none came for `idle` s."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=idle)
    sock.sendall(b"  V2SUB %s %s\nRDY 1000\n" % (TOPIC.encode(), CHANNEL.encode()))
    got: list[bytes] = []
    try:
        while True:
            size, frame_type = struct.unpack(">ii", exact(sock, 8))
            data = exact(sock, size - 4)
            if frame_type == 2:     # a message: timestamp 8, attempts 2, id 16, body
                got.append(data[26:])
                sock.sendall(b"FIN " + data[10:26] + b"\n")
            elif data == b"_heartbeat_":
                sock.sendall(b"NOP\n")
    except (socket.timeout, TimeoutError):
        pass
    sock.close()
    return got


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def post(port: int, path: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", path)
    assert conn.getresponse().status == 200, path
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=1000, help="msgs/s in all")
    parser.add_argument("--tcp", type=int, default=4, help="TCP producers")
    parser.add_argument("--http", type=int, default=2, help="HTTP producers")
    parser.add_argument("--restarts", type=int, default=1, help="SIGHUPs, one after another")
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="relay-rolling-")
    redis = None
    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        redis_port = embedded.free_port()
        redis = embedded.start(redis_port, tmp, extra=("--save", "", "--appendonly", "no"))
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
    tcp, http_port = embedded.free_port(), embedded.free_port()
    log = open(os.path.join(tmp, "broker.log"), "w+")
    broker = subprocess.Popen(
        [sys.executable, "-m", "relay", "broker", "--workers", str(args.workers),
         "--tcp-address", f"127.0.0.1:{tcp}", "--http-address", f"127.0.0.1:{http_port}"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp, env={**os.environ, "REDIS_URL": redis_url})
    producers: list[Producer] = []
    try:
        assert wait_for(lambda: "broker with" in open(log.name).read(), 30), "no broker"
        post(http_port, f"/topic/create?topic={TOPIC}")
        post(http_port, f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
        each = args.rate / (args.tcp + args.http)
        producers = [Producer(f"tcp{n}", tcp, each, "tcp") for n in range(args.tcp)] + \
                    [Producer(f"http{n}", http_port, each, "http") for n in range(args.http)]
        for producer in producers:
            producer.start()
        time.sleep(2)
        for _ in range(args.restarts):
            old = children(broker.pid)
            began = time.monotonic()
            broker.send_signal(signal.SIGHUP)
            assert wait_for(lambda: len(children(broker.pid)) == args.workers and
                            not old & children(broker.pid) and
                            "rolling restart done" in open(log.name).read()[-2000:], 120), \
                open(log.name).read()
            took = time.monotonic() - began
            time.sleep(2)
        for producer in producers:
            producer.running = False
        for producer in producers:
            producer.join(15)
        acked = [body for producer in producers for body in producer.acked]
        got = consume(tcp, len(acked))
        lost = set(acked) - set(got)
        print(f"workers: {args.workers}, producers: {args.tcp} TCP + {args.http} HTTP at "
              f"{args.rate:.0f} msgs/s in all, restarts: {args.restarts} "
              f"(the last took {took:.1f} s from SIGHUP to every worker new)")
        print(f"acknowledged: {len(acked)}")
        print(f"delivered: {len(got)} ({len(set(got))} distinct)")
        print(f"lost: {len(lost)}")
        print(f"duplicates: {len(got) - len(set(got))}")
        print(f"refused: {sum(p.refused for p in producers)}")
        print(f"reconnects: {sum(p.reconnects for p in producers)} "
              f"(resends {sum(p.resends for p in producers)})")
        print(f"longest publish gap: {max(p.longest_gap for p in producers) * 1000:.0f} ms "
              f"(TCP {max((p.longest_gap for p in producers if p.kind == 'tcp'), default=0) * 1000:.0f}"
              f", HTTP {max((p.longest_gap for p in producers if p.kind == 'http'), default=0) * 1000:.0f})")
        restarted = [line for line in open(log.name).read().splitlines()
                     if "replaced: pid" in line or "rolling restart done" in line
                     or "re-execut" in line]
        print("broker log:")
        for line in restarted:
            print("  " + line.split('msg="', 1)[-1].rstrip('"'))
    finally:
        for producer in producers:
            producer.running = False
        broker.terminate()
        try:
            broker.wait(20)
        except subprocess.TimeoutExpired:
            broker.kill()
        if redis is not None:
            redis.terminate()
            redis.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
