"""Reading a client's commands: lines and sized bodies off its transport."""

import re
import socket
import time
from typing import TYPE_CHECKING

import gevent
import greenlet

from relay import codec
from relay.broker.client import Client
from relay.broker.transport import Plain
from relay.deadlines import Deadlines
from relay.errors import Disconnect
from relay.sockio import Turns

if TYPE_CHECKING:
    from relay.options import Options

MAX_LINE = 16 * 1024
FIN_LINE = re.compile(rb"FIN ([^ \r\n]{%d})\r?\n" % codec.MSG_ID_LENGTH)
# FINs taken in one go from the read buffer: the group commit merges what follows, so a
# flood of FINs never makes one huge call (nor holds more than this per queued reply)
MAX_GATHERED_FINS = 128
TIMED_OUT = "command not complete within the client timeout"


def largest_command(options: "Options") -> int:
    """The most bytes one command may take: a line, a size and the largest body."""
    return MAX_LINE + 8 + max(options.max_body_size, options.max_msg_size)


class Reader:
    """Reads lines and sized bodies from a client's transport (which IDENTIFY may upgrade
    mid-connection) without ever allocating an announced size before it is checked."""

    CHUNK = 64 * 1024

    def __init__(self, client: Client, deadlines: Deadlines) -> None:
        self.client = client
        self.deadlines = deadlines
        self.buf = bytearray()
        self.pos = 0
        # monotonic seconds at which to look whether the command being read is overdue
        # (begin_command); None: no limit
        self.deadline: float | None = None
        self.turns = Turns()
        self._reading: "greenlet.greenlet | None" = None     # while it waits in recv
        # the client waits for an answer to all it sent (ProtocolV2.io_loop): the next
        # read waits until there is something to read (Plain.recv_when_readable)
        self.answer_awaited = False

    def take_turn(self) -> None:
        """Let the broker's other greenlets run if this connection has run long (Turns)."""
        self.turns.take()

    @property
    def buffered(self) -> int:
        """Bytes read from the transport and not yet consumed."""
        return len(self.buf) - self.pos

    def begin_command(self) -> None:
        """nsqd's read deadline: the next command must arrive whole within two heartbeats.

        A client is closed for it only when it is also silent towards the broker: a
        heartbeat it was sent an interval ago is still unanswered, and nothing it sent
        waits unread (_past_deadline). A broker that was busy (or starved of CPU) past the
        deadline thus closes no client whose answer is in the socket, nor one it sent no
        heartbeat to answer; otherwise this is nsqd's deadline, as heartbeats come every
        interval."""
        hb = self.client.heartbeat_interval
        self.deadline = time.monotonic() + 2 * hb / 1000 if hb > 0 else None
        self.client.unanswered_beat = None

    def _past_deadline(self, now: float) -> None:
        """The deadline passed: socket.timeout if the command is overdue (begin_command),
        else the deadline moves to when to look again: once a heartbeat's interval is up,
        or now if bytes wait unread (the read takes them, then looks again)."""
        assert self.deadline is not None
        interval = self.client.heartbeat_interval / 1000
        beat = self.client.unanswered_beat
        later = max(self.deadline, now + interval if beat is None else beat + interval)
        if later <= now:
            if not self.client.transport.unread():
                raise socket.timeout(TIMED_OUT)
            later = now
        self.deadline = later

    def _fill(self) -> None:
        """Read more; a client that drips a command slower than its deadline times out.
        A read that waits for the socket gives the others their turn."""
        if not self.answer_awaited:
            self.take_turn()
        while True:
            now = time.monotonic()
            if self.deadline is not None and self.deadline <= now:
                self._past_deadline(now)
            chunk = self._recv()
            if chunk:
                break
        if self.pos:
            del self.buf[:self.pos]
            self.pos = 0
        self.buf += chunk

    def _recv(self) -> bytes:
        """A read of the transport, which the broker's Deadlines end at the deadline (the
        socket's own timeout stays for writes: Client.send)."""
        if self.client.sock.timeout is not None:
            self.client.sock.settimeout(None)
        transport = self.client.transport
        recv = transport.recv
        if self.answer_awaited and type(transport) is Plain:
            recv = transport.recv_when_readable
        self.answer_awaited = False
        if self.deadline is None:
            return recv(self.CHUNK)
        self._reading = greenlet.getcurrent()
        self.deadlines.watch(self)
        try:
            return recv(self.CHUNK)
        finally:
            self._reading = None
            self.deadlines.unwatch(self)

    @property
    def expires(self) -> float:
        return self.deadline if self.deadline is not None else float("inf")

    def expire(self) -> None:
        """Raise socket.timeout in the recv this reader waits in if the command is
        overdue, as the socket's own timeout would, else watch it to its new deadline;
        from the hub, where nothing runs between the check and the throw."""
        gevent.get_hub().loop.run_callback(self._time_out)

    def _time_out(self) -> None:
        now = time.monotonic()
        if self._reading is None or self.deadline is None or self.deadline > now:
            return      # it read meanwhile, and its next read keeps its own deadline
        try:
            self._past_deadline(now)
        except socket.timeout as e:
            self._reading.throw(e)
            return
        self.deadlines.unwatch(self)    # as the keeper left it, or watched again meanwhile
        self.deadlines.watch(self)

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
