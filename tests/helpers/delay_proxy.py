"""A TCP proxy that delays each direction by a fixed time, as a slow link would: what
arrives at t leaves at t + delay, in order, so pipelined traffic keeps its throughput
(the kernel here has no netem to do it). With a MARKER, only a chunk holding it is
delayed, and what follows it on its connection waits behind it: one call held up, as by
a Redis slow on it, and the other connections' calls answered at once.

    python -m tests.helpers.delay_proxy LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS [MARKER]
"""

import queue
import socket
import sys
import threading
import time


def pump(source: socket.socket, sink: socket.socket, delay: float,
         marker: bytes | None = None) -> None:
    """Copy source to sink, each chunk (with a marker, each holding it) `delay` seconds
    after it was read."""
    chunks: queue.Queue = queue.Queue()

    def read() -> None:
        try:
            while chunk := source.recv(1 << 16):
                held = marker is None or marker in chunk
                chunks.put((time.monotonic() + (delay if held else 0.0), chunk))
        except OSError:
            pass
        chunks.put((time.monotonic() + delay, b""))

    threading.Thread(target=read, daemon=True).start()
    try:
        while True:
            due, chunk = chunks.get()
            time.sleep(max(0.0, due - time.monotonic()))
            if not chunk:
                break
            sink.sendall(chunk)
    except OSError:
        pass
    for sock in (source, sink):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(listen: tuple, target: tuple, delay: float, marker: bytes | None = None) -> None:
    server = socket.create_server(listen, reuse_port=True)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection(target, timeout=5)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(client, upstream, delay, marker),
                         daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client, delay, marker),
                         daemon=True).start()


def address(text: str) -> tuple:
    host, _, port = text.rpartition(":")
    return host, int(port)


if __name__ == "__main__":
    serve(address(sys.argv[1]), address(sys.argv[2]), int(sys.argv[3]) / 1000,
          sys.argv[4].encode() if len(sys.argv) > 4 else None)
