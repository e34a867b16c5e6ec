"""A raw NSQ V2 client over a socket, for tests that check exact bytes."""

import json
import socket
import struct
import time

from relay.codec import FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT, parse_record


def size(n: int) -> bytes:
    """A size field: 4 bytes, big-endian, signed."""
    return struct.pack(">i", n)


def mpub_body(bodies, count=None) -> bytes:
    """An MPUB body; `count` declares another number of messages than it holds."""
    return size(len(bodies) if count is None else count) + b"".join(
        size(len(b)) + b for b in bodies)


class Wire:
    def __init__(self, port, magic=b"  V2", timeout=5.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        if magic:
            self.sock.sendall(magic)

    def send(self, data: bytes):
        self.sock.sendall(data)
        return self

    def command(self, line: str | bytes, body: bytes | None = None):
        line = line.encode() if isinstance(line, str) else line
        data = line + b"\n"
        if body is not None:
            data += size(len(body)) + body
        return self.send(data)

    def send_quietly(self, data: bytes):
        """Send, ignoring the server having closed already."""
        try:
            self.send(data)
        except OSError:
            pass

    def exact(self, n):
        """The next n bytes."""
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError(f"closed after {len(data)} of {n} bytes")
            data += chunk
        return data

    def frame(self, skip_heartbeats=True):
        """(frame type, data) of the next frame."""
        while True:
            length, frame_type = struct.unpack(">ii", self.exact(8))
            data = self.exact(length - 4)
            if not (skip_heartbeats and frame_type == FRAME_RESPONSE and data == HEARTBEAT):
                return frame_type, data

    def response(self):
        return self.frame()

    def message(self):
        """(timestamp, attempts, id, body) of the next message frame."""
        frame_type, data = self.frame()
        assert frame_type == FRAME_MESSAGE, (frame_type, data)
        return parse_record(data)

    def finish_next(self, n: int) -> list[bytes]:
        """The bodies of the next n message frames, each finished as it comes."""
        bodies = []
        for _ in range(n):
            message = self.message()
            bodies.append(message[3])
            self.command(b"FIN " + message[2])
        return bodies

    def identify(self, **fields):
        self.command("IDENTIFY", json.dumps(fields).encode())
        return self.frame()

    def pub(self, topic, body: bytes):
        self.command(f"PUB {topic}", body)
        return self.frame()

    def mpub(self, topic, bodies):
        self.command(f"MPUB {topic}", mpub_body(bodies))
        return self.frame()

    def sub(self, topic, channel, rdy=None):
        self.command(f"SUB {topic} {channel}")
        reply = self.frame()
        if rdy is not None:
            self.command(f"RDY {rdy}")
        return reply

    def closed(self, timeout=3.0) -> bool:
        """True if the server closed the connection (EOF) within timeout."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except (socket.timeout, TimeoutError):
            return False
        except ConnectionResetError:
            return True

    def rest(self, timeout: float = 4.0) -> bytes:
        """Everything the server still sends until it closes; fails if it does not close."""
        self.sock.settimeout(timeout)
        data = b""
        deadline = time.monotonic() + timeout
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return data
                data += chunk
                if time.monotonic() > deadline:
                    break
        except (ConnectionResetError, BrokenPipeError):
            return data
        except (socket.timeout, TimeoutError):
            pass
        raise AssertionError(f"connection still open after {timeout}s (got {data!r})")

    def nothing(self, wait=0.3) -> bool:
        """True if no frame other than heartbeats arrives within `wait` seconds."""
        self.sock.settimeout(wait)
        try:
            self.frame()
            return False
        except (socket.timeout, TimeoutError):
            return True
        finally:
            self.sock.settimeout(5.0)

    def close(self):
        self.sock.close()


def subscribed(port: int, topic="t", channel="ch", rdy=None) -> Wire:
    """A new connection subscribed to topic/channel (and RDY rdy if given)."""
    w = Wire(port)
    assert w.sub(topic, channel, rdy=rdy) == (FRAME_RESPONSE, b"OK")
    return w
