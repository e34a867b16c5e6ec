"""Thousands of raw-socket consumers in one test process."""

import resource
import selectors
import socket
import struct
import time


class Consumers:
    """Consumers at RDY 1, one per topic given, each on a channel of its own (c0, c1,
    ...), read from one selector: each FINs what it gets."""

    def __init__(self, port: int, topics: list[str]):
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        self.selector = selectors.DefaultSelector()
        self.buffers: dict[socket.socket, bytes] = {}
        for i, topic in enumerate(topics):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"  V2" + f"SUB {topic} c{i}\nRDY 1\n".encode())
            self.buffers[sock] = b""
            self.selector.register(sock, selectors.EVENT_READ)
        oks = 0
        while oks < len(topics):
            oks += sum(1 for kind, _ in self._frames(10) if kind == 0)

    def _frames(self, timeout: float) -> list[tuple[int, bytes]]:
        """(frame type, payload) of what arrived within `timeout`; messages FINned."""
        out = []
        for key, _ in self.selector.select(timeout):
            sock = key.fileobj
            data = sock.recv(65536)
            assert data, "the broker closed a consumer"
            buffer = self.buffers[sock] + data
            while len(buffer) >= 8:
                size, kind = struct.unpack(">ii", buffer[:8])
                if len(buffer) < 4 + size:
                    break
                payload, buffer = buffer[8:4 + size], buffer[4 + size:]
                if kind == 2:
                    sock.sendall(b"FIN " + payload[10:26] + b"\n")
                out.append((kind, payload))
            self.buffers[sock] = buffer
        return out

    def receive(self, body: bytes, expected: int, within: float) -> int:
        """How many consumers got `body`, waiting up to `within` seconds for `expected`."""
        got, until = 0, time.monotonic() + within
        while got < expected and time.monotonic() < until:
            got += sum(1 for kind, payload in self._frames(0.1)
                       if kind == 2 and payload[26:] == body)
        return got

    def time_publish(self, wire, topic: str, body: bytes, expected: int,
                     within: float) -> tuple[int, float]:
        """PUB `body` on `wire` (its OK left unread), then how many consumers got it,
        waiting up to `within` seconds for `expected`, and how long that took."""
        started = time.monotonic()
        wire.command(f"PUB {topic}", body)
        got = self.receive(body, expected, within)
        return got, time.monotonic() - started

    def close(self) -> None:
        for sock in self.buffers:
            sock.close()
