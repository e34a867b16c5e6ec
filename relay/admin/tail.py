"""`relay-admin tail`: read a topic through an ephemeral channel of a live broker, as
nsq_tail does. The broker deletes the channel when the connection closes, however
it closes, so nothing is left behind."""

import json
import random
import socket
import struct

from relay import codec
from relay.errors import RelayError

USER_AGENT = "relay-admin tail"
MAX_IN_FLIGHT = 200
TIMEOUT = 5.0


class TailError(RelayError):
    """The broker refused or closed the connection."""


class Tail:
    """One NSQ V2 consumer connection on a fresh `tailNNNNNN#ephemeral` channel."""

    def __init__(self, host: str, port: int, topic: str):
        self.channel = f"tail{random.randrange(1_000_000):06d}#ephemeral"
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT)
        self.file = self.sock.makefile("rb")
        self.sock.sendall(codec.MAGIC_V2)
        self._command(b"IDENTIFY", json.dumps({"user_agent": USER_AGENT}).encode())
        self._command(f"SUB {topic} {self.channel}".encode())
        self.sock.settimeout(None)

    def messages(self, count: int | None):
        """Yield (id, timestamp ns, attempts, body) of `count` messages (None: forever),
        each finished once taken."""
        self.sock.sendall(f"RDY {min(count or MAX_IN_FLIGHT, MAX_IN_FLIGHT)}\n".encode())
        taken = 0
        while count is None or taken < count:
            kind, data = self._frame()
            if kind == codec.FRAME_MESSAGE:
                ts, attempts, msg_id, body = codec.parse_record(data)
                self.sock.sendall(b"FIN " + msg_id + b"\n")
                taken += 1
                yield msg_id.decode(), ts, attempts, body
            elif data == codec.HEARTBEAT:
                self.sock.sendall(b"NOP\n")

    def close(self) -> None:
        """CLS, then close; messages still in flight are requeued by the broker."""
        try:
            self.sock.sendall(b"CLS\n")
        except OSError:
            pass
        self.sock.close()

    def _command(self, line: bytes, body: bytes | None = None) -> None:
        data = line + b"\n"
        if body is not None:
            data += codec.pack_size(len(body)) + body
        self.sock.sendall(data)
        kind, reply = self._frame()
        if kind != codec.FRAME_RESPONSE or reply != codec.OK:
            raise TailError(reply.decode(errors="replace"))

    def _frame(self) -> tuple[int, bytes]:
        header = self.file.read(8)
        if header.startswith(b"HTTP/"):
            raise TailError("it answers HTTP: give the broker's TCP port (--tcp-address, "
                            "e.g. 4150), not an HTTP port")
        if len(header) < 8:
            raise TailError("the broker closed the connection")
        size, kind = struct.unpack(">ii", header)
        data = self.file.read(size - 4)
        if kind == codec.FRAME_ERROR:
            raise TailError(data.decode(errors="replace"))
        return kind, data
