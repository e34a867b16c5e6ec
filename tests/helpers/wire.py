"""A raw NSQ V2 client over a socket, for tests that check exact bytes."""

import json
import socket
import struct

from relay.codec import FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT, parse_record


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
            data += struct.pack(">i", len(body)) + body
        return self.send(data)

    def _exact(self, n):
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
            size, frame_type = struct.unpack(">ii", self._exact(8))
            data = self._exact(size - 4)
            if not (skip_heartbeats and frame_type == FRAME_RESPONSE and data == HEARTBEAT):
                return frame_type, data

    def response(self):
        return self.frame()

    def message(self):
        """(timestamp, attempts, id, body) of the next message frame."""
        frame_type, data = self.frame()
        assert frame_type == FRAME_MESSAGE, (frame_type, data)
        return parse_record(data)

    def identify(self, **fields):
        self.command("IDENTIFY", json.dumps(fields).encode())
        return self.frame()

    def pub(self, topic, body: bytes):
        self.command(f"PUB {topic}", body)
        return self.frame()

    def mpub(self, topic, bodies):
        payload = struct.pack(">i", len(bodies))
        for b in bodies:
            payload += struct.pack(">i", len(b)) + b
        self.command(f"MPUB {topic}", payload)
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
