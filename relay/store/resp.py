"""RESP spoken directly on the group commit's own connection (ScriptRunner._send).

redis-py makes the connection (handshake, AUTH, SELECT, TLS, socket timeouts); the
commands of a pipeline are then packed with hiredis' `pack_command` and their replies
read with a hiredis Reader of our own, one C call per command each way. redis-py's
`pack_commands` and `read_response` wrap the same C calls in a generator per command
and, per reply, checks, exception handlers and a health-check clock: under one-message
PUBs they were a fifth of the broker's CPU.

Errors are what redis-py's own read gives: a command's error reply is its reply (the
exception redis-py's parser maps it to: NoScriptError, ...), a lost or timed-out
connection raises redis' ConnectionError or TimeoutError with redis-py's texts.
"""

import socket
import time
from itertools import islice
from typing import TYPE_CHECKING, Any, Sequence, cast

import gevent
import gevent.socket
import greenlet
import hiredis
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError, DataError, InvalidResponse, TimeoutError

if TYPE_CHECKING:
    from redis.connection import AbstractConnection

    from relay.deadlines import Deadlines

READ_SIZE = 65536       # redis-py's socket_read_size
NOT_ENOUGH_DATA = object()


def pack(commands: Sequence[Sequence[Any]]) -> bytes:
    """The commands in RESP, as redis-py packs them."""
    try:
        return b"".join([hiredis.pack_command(cast(Any, tuple(c))) for c in commands])
    except TypeError:   # an argument only redis-py's packer converts, or a bad one
        return b"".join([_pack_converted(c) for c in commands])


def _pack_converted(command: Sequence[Any]) -> bytes:
    """One command with bytearray and memoryview arguments as bytes (redis-py converts
    them); anything else hiredis refuses (None, bool...) is redis-py's DataError."""
    args = tuple(bytes(a) if isinstance(a, (bytearray, memoryview)) else a for a in command)
    try:
        return hiredis.pack_command(cast(Any, args))    # its stub takes 1-tuples only
    except TypeError as e:
        raise DataError(str(e)) from None


class Errors:
    """The exception of each error reply, as hiredis makes them, counted."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, message: str) -> Exception:
        self.count += 1
        return BaseParser.parse_error(message)


class Replies:
    """The replies of a connection's pipelines, read from its socket. Made after each
    connect: a reader left with part of a reply from a lost connection is dropped with
    it.

    Given `deadlines` (a broker's), a read waits for the socket to be readable first,
    its socket timeout kept by them (expire): not a read that finds nothing, an
    exception and a gevent Timeout (a libev timer started and stopped) per reply
    awaited, which cost a one-message command more than the rest of its read."""

    def __init__(self, conn: "AbstractConnection", deadlines: "Deadlines | None" = None) -> None:
        self.errors = Errors()
        encoder = getattr(conn, "encoder")
        options: dict[str, Any] = {
            "protocolError": InvalidResponse, "replyError": self.errors,
            "errors": encoder.encoding_errors, "notEnoughData": NOT_ENOUGH_DATA}
        if encoder.decode_responses:
            options["encoding"] = encoder.encoding
        self.reader = hiredis.Reader(**options)
        self.sock = getattr(conn, "_sock")
        self.buffer = bytearray(READ_SIZE)
        self.timeout: float | None = getattr(conn, "socket_timeout", None)
        # a plain gevent socket only: a TLS one may hold decrypted bytes already
        plain = type(self.sock) is gevent.socket.socket
        self.deadlines = deadlines if plain and self.timeout else None
        self.expires = float("inf")
        self._reading: "greenlet.greenlet | None" = None     # while it waits to read

    def read(self, count: int) -> list:
        """The next `count` replies; an error reply is its exception, as a value. A
        reply that says the connection is unusable (LOADING, ...) raises, as redis-py's
        read does. The replies at hand are taken in one C loop (iter of gets), and
        looked through only if there was an error among them: a pipeline of 35,000
        replies (/stats at 5,000 channels) took 20 ms looked through one by one, 8 ms
        so."""
        self.errors.count = 0
        replies: list = []
        while True:
            replies += islice(iter(self.reader.gets, NOT_ENOUGH_DATA), count - len(replies))
            if len(replies) == count:
                break
            self._fill()
        if self.errors.count:
            for reply in replies:
                if isinstance(reply, ConnectionError):
                    raise reply
                if isinstance(reply, list) and reply and isinstance(reply[0], ConnectionError):
                    raise reply[0]
        return replies

    def _fill(self) -> None:
        try:
            if self.deadlines is not None:
                self._wait_readable(self.deadlines)
            size = self.sock.recv_into(self.buffer)
        except socket.timeout:
            raise TimeoutError("Timeout reading from socket") from None
        except OSError as e:
            raise ConnectionError(f"Error while reading from socket: {e.args}") from None
        if size == 0:
            raise ConnectionError("Connection closed by server.")
        self.reader.feed(cast(bytes, self.buffer), 0, size)    # it reads any buffer

    def _wait_readable(self, deadlines: "Deadlines") -> None:
        self.expires = time.monotonic() + cast(float, self.timeout)
        self._reading = greenlet.getcurrent()
        deadlines.watch(self)
        try:
            self.sock.hub.wait(getattr(self.sock, "_read_event"))
        finally:
            self._reading = None
            deadlines.unwatch(self)

    def expire(self) -> None:
        """The socket timeout passed (Deadlines): the wait raises socket.timeout, thrown
        from the hub, where nothing runs between the check and the throw."""
        gevent.get_hub().loop.run_callback(self._time_out)

    def _time_out(self) -> None:
        if self._reading is not None and time.monotonic() >= self.expires:
            self._reading.throw(socket.timeout("timed out"))
