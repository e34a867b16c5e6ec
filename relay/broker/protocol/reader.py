"""Reading a client's commands: lines and sized bodies off its transport."""

import re
import socket
import time
from typing import TYPE_CHECKING

import gevent

from relay import codec
from relay.broker.client import Client
from relay.errors import Disconnect

if TYPE_CHECKING:
    from relay.options import Options

MAX_LINE = 16 * 1024
FIN_LINE = re.compile(rb"FIN ([^ \r\n]{%d})\r?\n" % codec.MSG_ID_LENGTH)
# FINs taken in one go from the read buffer: the group commit merges what follows, so a
# flood of FINs never makes one huge call (nor holds more than this per queued reply)
MAX_GATHERED_FINS = 128
# the longest a connection's reading runs before the broker's other greenlets get a
# turn: reads that find data waiting never block, so a client that floods NOPs, or
# sends an MPUB of a million messages, would otherwise hold the broker. The pause is a
# timer, not sleep(0), which runs the greenlets already woken but does not poll the
# other sockets (their clients then waited 50 ms and more).
YIELD_EVERY = 0.002
YIELD_PAUSE = 0.0001


def largest_command(options: "Options") -> int:
    """The most bytes one command may take: a line, a size and the largest body."""
    return MAX_LINE + 8 + max(options.max_body_size, options.max_msg_size)


class Reader:
    """Reads lines and sized bodies from a client's transport (which IDENTIFY may upgrade
    mid-connection) without ever allocating an announced size before it is checked."""

    CHUNK = 64 * 1024

    def __init__(self, client: Client) -> None:
        self.client = client
        self.buf = bytearray()
        self.pos = 0
        # monotonic seconds by which the command being read must have arrived whole, as
        # nsqd's read deadline (2 heartbeats); None: no limit
        self.deadline: float | None = None
        self._loop = gevent.get_hub().loop
        self._iteration = -1        # of the event loop, when this turn began
        self._turn_began = 0.0

    def take_turn(self) -> None:
        """Let the broker's other greenlets run if this connection has run YIELD_EVERY
        since they last could: since the event loop last went round (a read that waited,
        or a turn given). A client that waits for each reply never pauses here; a loop
        without an iteration count makes this a plain clock."""
        iteration, now = getattr(self._loop, "iteration", 0), time.monotonic()
        if iteration != self._iteration:
            self._iteration, self._turn_began = iteration, now
        elif now - self._turn_began >= YIELD_EVERY:
            gevent.sleep(YIELD_PAUSE)
            self._iteration = getattr(self._loop, "iteration", 0)
            self._turn_began = time.monotonic()

    @property
    def buffered(self) -> int:
        """Bytes read from the transport and not yet consumed."""
        return len(self.buf) - self.pos

    def _fill(self) -> None:
        """Read more; a client that drips a command slower than its deadline times out."""
        self.take_turn()
        while True:
            remaining = None
            if self.deadline is not None:
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    raise socket.timeout("command not complete within the client timeout")
            self.client.sock.settimeout(remaining)
            chunk = self.client.transport.recv(self.CHUNK)
            if chunk:
                break
        if self.pos:
            del self.buf[:self.pos]
            self.pos = 0
        self.buf += chunk

    def line(self) -> bytes:
        while True:
            end = self.buf.find(b"\n", self.pos)
            if end >= 0:
                break
            if self.buffered > MAX_LINE:
                raise Disconnect("command line too long")
            try:
                self._fill()
            except EOFError:
                raise Disconnect("eof") from None
        if end - self.pos > MAX_LINE:
            raise Disconnect("command line too long")
        line = bytes(self.buf[self.pos:end])
        self.pos = end + 1
        return line[:-1] if line.endswith(b"\r") else line

    def buffered_fin(self) -> bytes | None:
        """The message id of the next command if it is a FIN already read and well formed
        (as the line reader would take it: one 16-byte argument, LF or CRLF); it is then
        consumed. Lets FIN take the FINs that follow it in one go, without reading more."""
        match = FIN_LINE.match(self.buf, self.pos)
        if match is None:
            return None
        self.pos = match.end()
        return match.group(1)

    def exact(self, n: int) -> bytes:
        while self.buffered < n:
            self._fill()
        data = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return data

    def size(self) -> int:
        return codec.read_size(self.exact(4))
