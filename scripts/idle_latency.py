"""How long an idle consumer waits for a newly published message (issue 2, item 7).

Starts an embedded Redis and one broker on free ports, subscribes one consumer
(RDY 1), then publishes N single messages spaced apart so the consumer is idle
each time, and prints one JSON line: p50/p99/max of publish-to-receive in ms.

    .venv/bin/python scripts/idle_latency.py [--samples 200] [--gap-ms 20]
"""

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

from relay import embedded


def frame(sock):
    def exact(n):
        data = b""
        while len(data) < n:
            data += sock.recv(n - len(data))
        return data
    size, kind = struct.unpack(">ii", exact(8))
    return kind, exact(size - 4)


def connect(port):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2")
    return sock


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--gap-ms", type=int, default=20)
    args = parser.parse_args()
    redis_port, tcp_port = embedded.free_port(), embedded.free_port()
    data = tempfile.mkdtemp()
    redis_proc = embedded.start(redis_port, data, extra=("--save", "", "--appendonly", "no"))
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0"}
    broker = subprocess.Popen([sys.executable, "-m", "relay", "broker", "--tcp-address",
                               f"127.0.0.1:{tcp_port}"], env=env, stderr=subprocess.DEVNULL)
    try:
        embedded.wait_for_port("127.0.0.1", tcp_port, broker)
        consumer, producer = connect(tcp_port), connect(tcp_port)
        consumer.sendall(b"SUB latency c\nRDY 1\n")
        assert frame(consumer) == (0, b"OK")
        samples = []
        for i in range(args.samples):
            time.sleep(args.gap_ms / 1000)
            body = b"%d" % i
            start = time.perf_counter()
            producer.sendall(b"PUB latency\n" + struct.pack(">i", len(body)) + body)
            kind, payload = frame(consumer)
            samples.append((time.perf_counter() - start) * 1000)
            assert kind == 2 and payload[26:] == body
            consumer.sendall(b"FIN " + payload[10:26] + b"\n")
            assert frame(producer) == (0, b"OK")
        samples.sort()
        print(json.dumps({"workload": "idle consumer latency", "samples": len(samples),
                          "p50_ms": round(samples[len(samples) // 2], 2),
                          "p99_ms": round(samples[int(len(samples) * 0.99) - 1], 2),
                          "max_ms": round(samples[-1], 2)}))
    finally:
        broker.terminate()
        broker.wait(10)
        redis_proc.terminate()
        redis_proc.wait(10)


if __name__ == "__main__":
    main()
