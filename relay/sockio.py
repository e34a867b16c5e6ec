"""Listening sockets brokers can share, and socket writes without gevent's per-call
overhead."""

import fcntl
import resource
import socket
import struct
import termios
import time

import gevent
import gevent.socket
from gevent import monkey

# the longest a greenlet runs before the broker's other greenlets get a turn: reads that
# find data waiting never block, so a client that floods NOPs or pipelined requests, or
# sends an MPUB of a million messages, would otherwise hold the broker. The pause is a
# timer, not sleep(0), which runs the greenlets already woken but does not poll the
# other sockets (their clients then waited 50 ms and more).
YIELD_EVERY = 0.002
YIELD_PAUSE = 0.0001


class Turns:
    """Gives the process's other greenlets a turn once this one has run YIELD_EVERY since
    they last could: since the event loop last went round (a read that waited, or a turn
    given). Work that waits for each reply never pauses here; outside a gevent process
    (relay-admin, Spark) it never pauses."""

    def __init__(self) -> None:
        self._patched = monkey.is_module_patched("socket")
        self._loop = gevent.get_hub().loop if self._patched else None
        self._iteration = -1        # of the event loop, when this turn began
        self._began = 0.0

    def take(self) -> None:
        if not self._patched:
            return
        iteration, now = getattr(self._loop, "iteration", 0), time.monotonic()
        if iteration != self._iteration:
            self._iteration, self._began = iteration, now
        elif now - self._began >= YIELD_EVERY:
            gevent.sleep(YIELD_PAUSE)
            self._iteration = getattr(self._loop, "iteration", 0)
            self._began = time.monotonic()


def wait_readable(sock) -> None:
    """Wait until a plain gevent socket has something to read, for a reader that
    expects nothing yet (its client waits for an answer): a read that finds nothing
    costs gevent a syscall and an exception before it waits all the same. A TLS
    socket may hold decrypted bytes already: no wait."""
    event = getattr(sock, "_read_event", None)
    if type(sock) is gevent.socket.socket and event is not None:
        getattr(sock, "_wait")(event)


def send_all(sock, data: bytes) -> None:
    """sock.sendall, but a write that fits the socket buffer costs one send() syscall:
    gevent's sendall also asks getsockopt(SO_SNDBUF) on every call (7% of the broker
    under pub P=4). A plain gevent socket is written directly (its own socket is
    non-blocking), without gevent's wrapper of a send that may wait."""
    if type(sock) is gevent.socket.socket:
        try:
            sent = getattr(sock, "_sock").send(data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            sock.sendall(memoryview(data)[sent:])
        return
    timeout = sock.gettimeout()
    sent = sock.send(data)
    if sent < len(data):
        sock.settimeout(timeout)    # another greenlet may have set its own while send waited
        sock.sendall(memoryview(data)[sent:])


def unread_bytes(sock) -> int:
    """Bytes that arrived on the socket and were not read yet (FIONREAD): what a busy
    process has received though it has not looked; 0 once the socket is closed."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]
    except (OSError, ValueError):
        return 0


# sockets bound by a parent for this process to listen on (relay/broker/prefork.py), by
# address: listen() takes the address's rather than binding another, so its accept queue
# is the parent's to hand to this worker's successor
inherited: dict[str, socket.socket] = {}


# connections a listener accepts per turn of the event loop (gevent's default: 100). Each
# one's greenlet starts from the loop's callback queue, behind which every wake-up waits
# (a lane's next pipeline, a channel's delivery); the loop runs 5 ms of callbacks per
# turn, so 100 new connections a turn, at about 0.3 ms each, grew that queue without
# bound under a flood of connections: a PUB waited 1.1-7.4 s (issue 57). Eight a turn
# cost at most about 2.5 ms of it.
MAX_ACCEPT = 8


def listen(address: str) -> socket.socket:
    """A listening socket that other broker processes may share (SO_REUSEPORT). An
    OSError names the address (its `filename`), so the one line says which port."""
    given = inherited.pop(address, None)
    # socket.socket, called now: gevent's in a patched worker, whatever made `given`
    sock = reserve(address) if given is None else socket.socket(fileno=given.detach())
    try:
        sock.listen(1024)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, e.strerror, address) from None
    sock.setblocking(False)
    return sock


def reserve(address: str) -> socket.socket:
    """A socket bound to the address with SO_REUSEPORT but not listening: it holds the
    port (port 0: a free one) for brokers that listen on it, and takes no connections
    itself. An OSError names the address, as listen's."""
    host, _, port = address.rpartition(":")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host.strip("[]"), int(port)))
    except OSError as e:
        sock.close()
        raise OSError(e.errno, e.strerror, address) from None
    return sock


def raise_open_file_limit() -> int:
    """Lift the soft limit on open files to the hard one (as far as we may); the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft
