"""Accept floods beside nsqd (issue 57 item 1): one client process opens connections as
fast as it can for --seconds, each sending a little and closing, while a witness
connection publishes every 20 ms; what the witness waited (median, worst, answers over
100 ms) and how many connections the flood made, relay and nsqd v1.3.0
(../shared/bin/nsq-1.3.0) alternately on the same load.

- `http`: a `/pub` head with `Content-Length: 10`, 2 body bytes, close;
- `tcp`: the protocol magic `  V2`, close.

    .venv/bin/python -m scripts.accept_flood [--flood http|tcp] [--seconds 10] [--runs 2]
"""

import argparse
import socket
import statistics
import threading
import time

from scripts.bench import Stack
from scripts.bench_stats import Nsqd, witness

SENT = {"http": b"POST /pub?topic=flood HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nab",
        "tcp": b"  V2"}


def flood(port: int, data: bytes, seconds: float) -> int:
    """Connections made: connect, send `data`, close, over and over."""
    deadline, made = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(data)
            sock.close()
            made += 1
        except OSError:
            time.sleep(0.001)    # out of ports, or the backlog full: the flood's own limit
    return made


def one_run(target, args) -> dict:
    port = target.http_ports[0] if args.flood == "http" else target.tcp_port
    stop, slowest, answers = threading.Event(), [0.0], []
    thread = threading.Thread(target=witness, args=(target.tcp_port, stop, slowest, answers))
    thread.start()
    time.sleep(0.5)
    made = flood(port, SENT[args.flood], args.seconds)
    time.sleep(0.5)
    stop.set()
    thread.join()
    return {"connections": made, "witness_answers": len(answers),
            "witness_p50_ms": round(statistics.median(answers) * 1000, 2),
            "witness_worst_ms": round(max(answers) * 1000, 1),
            "witness_over_100ms": sum(a > 0.1 for a in answers)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flood", choices=sorted(SENT), default="http")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    for _ in range(args.runs):
        for name, make in (("relay", lambda: Stack(1)), ("nsqd", Nsqd)):
            target = make()
            try:
                print(name, args.flood, one_run(target, args), flush=True)
            finally:
                target.stop()


if __name__ == "__main__":
    main()
