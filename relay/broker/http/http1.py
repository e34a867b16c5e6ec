"""HTTP/1.1 framing as strict as nsqd's (Go's net/http), for WSGI apps on gevent sockets.

Requests are parsed by httptools (llhttp, Node.js's parser): strict by default and at C
speed. What Go's server refuses, this refuses too, and then closes the connection, so
no byte of one request can be read as part of another: duplicate or signed
Content-Length, Content-Length beside Transfer-Encoding, any Transfer-Encoding but one
`chunked` (501), header lines without a colon or with space before it, bad chunk
sizes, more than 1 MB of headers (431), an HTTP version other than 1.x (505), an
Expect other than 100-continue (417), HTTP/1.1 without Host.

An app runs only once its request's headers and whole body are in: a connection that
ends before runs nothing. A body over the app's limit for its path is refused before
it is read (413, then the connection closes). Every answer goes out in one write on a
TCP_NODELAY socket, so a keep-alive client never waits on Nagle and a delayed ACK.
Faults a client causes are counted in ClientFaults, never logged as tracebacks.
"""

import email.utils
import io
import logging
import re
import socket
import sys
import time
from typing import Callable, NamedTuple
from urllib.parse import unquote_to_bytes

import httptools
from gevent.pool import Pool
from gevent.server import StreamServer

from relay.log import ClientFaults
from relay.sockio import MAX_ACCEPT, Turns, send_all, wait_readable

log = logging.getLogger("relay.http")

MAX_HEADER_BYTES = (1 << 20) + 4096     # Go's DefaultMaxHeaderBytes and its read slack
READ_SIZE = 65536
BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")
VERSION = re.compile(rb"^[A-Z]+ \S+ HTTP/\d\.\d\r?$", re.MULTILINE)


class Reply(NamedTuple):
    """An answer: "200 OK", its headers and its body."""
    status: str
    headers: list[tuple[str, str]]
    body: bytes


# (method, path) -> (the most body bytes the path takes, the 413 answer past it)
BodyLimit = Callable[[str, str], tuple[int, Reply]]


class Refusal(Exception):
    """A request the server answers itself, after which the connection closes."""

    def __init__(self, fault: str, reply: Reply):
        super().__init__(fault)
        self.fault = fault
        self.reply = reply


def go_error(code: int, reason: str, text: str = "") -> Reply:
    """Go's own answer to a request it cannot serve: plain text naming the status."""
    status = f"{code} {reason}" + (f": {text}" if text else "")
    return Reply(status, [("Content-Type", "text/plain; charset=utf-8")], status.encode())


def bad_request(text: str = "") -> Refusal:
    return Refusal("malformed", go_error(400, "Bad Request", text))


def unsupported_version() -> Refusal:
    return Refusal("unsupported version", go_error(
        505, "HTTP Version Not Supported", "unsupported protocol version"))


def unsupported_coding() -> Refusal:
    return Refusal("unsupported transfer encoding", Reply(
        "501 Not Implemented", [("Content-Type", "text/plain; charset=utf-8")],
        b"Unsupported transfer encoding"))


def head_too_big() -> Refusal:
    return Refusal("oversized head", go_error(431, "Request Header Fields Too Large"))


class Incoming:
    """One request as the parser hands it over."""

    __slots__ = ("url", "headers", "head_size", "body", "method", "version", "keep_alive",
                 "limit", "too_big", "wants_continue")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_size = 0      # the target's bytes and each header's, with ": " and CRLF
        self.body: list[bytes] = []
        self.method = ""
        self.version = "1.1"
        self.keep_alive = True
        self.limit = 0
        self.too_big: Reply | None = None
        self.wants_continue = False


class Connection:
    """One client connection: requests read whole, run in order, answered in one write
    per read."""

    def __init__(self, server: "Http1Server", sock, address):
        self.server = server
        self.sock = sock
        self.address = address
        self.parser = httptools.HttpRequestParser(self)
        self.current: Incoming | None = None
        self.complete: list[Incoming] = []
        self.body_bytes = 0
        self.header_bytes = 0
        self.refusal: Refusal | None = None
        self.upgrade = False
        self.turns = Turns()    # a client pipelining without pause holds no one up

    # -- httptools' callbacks ------------------------------------------------------

    def on_message_begin(self) -> None:
        self.current = Incoming()
        self.body_bytes = self.header_bytes = 0

    def on_url(self, url: bytes) -> None:
        assert self.current is not None
        self.current.url += url
        self.current.head_size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.current is not None
        self.current.headers.append((name, value))
        self.current.head_size += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        request = self.current
        assert request is not None
        request.method = self.parser.get_method().decode("latin-1")
        request.version = self.parser.get_http_version()
        try:
            self._check(request)
        except Refusal as refusal:
            self.refusal = refusal
            raise

    def on_body(self, chunk: bytes) -> None:
        request = self.current
        assert request is not None
        self.body_bytes += len(chunk)
        if self.body_bytes > request.limit:
            assert request.too_big is not None
            self.refusal = Refusal("oversized body", request.too_big)
            raise self.refusal
        request.body.append(chunk)

    def on_message_complete(self) -> None:
        assert self.current is not None
        self.current.keep_alive = self.parser.should_keep_alive()
        self.complete.append(self.current)
        self.current = None

    def _check(self, request: Incoming) -> None:
        """Go's checks of the head, in its order; the body's limit, before any of it."""
        if request.head_size > MAX_HEADER_BYTES:
            raise head_too_big()
        if request.version[0] != "1":
            raise unsupported_version()
        fields: dict[bytes, list[bytes]] = {}
        for name, value in request.headers:
            fields.setdefault(name.lower(), []).append(value)
        hosts = fields.get(b"host", [])
        if len(hosts) > 1:
            raise bad_request("too many Host headers")
        if not hosts and request.version == "1.1":
            raise bad_request("missing required Host header")
        codings = fields.get(b"transfer-encoding")
        if codings is not None and (len(codings) != 1 or codings[0].lower() != b"chunked"):
            raise unsupported_coding()
        request.limit, request.too_big = self.server.body_limit(
            request.method, self._path(request.url))
        declared = fields.get(b"content-length")
        if declared and int(declared[0]) > request.limit:
            raise Refusal("oversized body", request.too_big)
        expect = fields.get(b"expect", [b""])[0].strip().lower()
        if expect == b"100-continue" and request.version == "1.1":
            request.wants_continue = codings is not None or int(declared[0] if declared else 0) > 0
        elif expect:
            raise Refusal("unsupported expectation", Reply("417 Expectation Failed", [], b""))

    @staticmethod
    def _path(url: bytes) -> str:
        """The decoded path of a request target, for the app's body limit."""
        return url.split(b"?", 1)[0].decode("latin-1")

    # -- the connection ------------------------------------------------------------

    def serve(self) -> None:
        try:
            while self._read():
                pass
        except OSError as e:
            self.server.faults.note("reset", self.address, str(e))
        finally:
            self.sock.close()
            del self.parser     # it holds this connection: freed now, not by the next GC

    def _read(self) -> bool:
        """Read once, answer what is complete; False once the connection is done.
        Once every request read is answered, the client likely waits for nothing more
        than sending its next one: the socket is waited on first, and that wait gives
        the others their turn."""
        if self.current is None and not self.complete:
            wait_readable(self.sock)
        else:
            self.turns.take()
        data = self.sock.recv(READ_SIZE)
        if not data:
            if self.current is not None:
                self.server.faults.note("aborted", self.address,
                                        "the connection ended mid-request")
            return False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.upgrade = True     # nsqd's API has no upgrades: served, then closed
            if self.complete:
                self.complete[-1].keep_alive = False
        except httptools.HttpParserCallbackError:
            assert self.refusal is not None
        except httptools.HttpParserError as e:
            self.refusal = self._parse_refusal(str(e), data)
        reading_head = self.current is not None and not self.current.method
        if reading_head and self.refusal is None:
            self.header_bytes += len(data)
            if self.header_bytes > MAX_HEADER_BYTES:
                self.refusal = head_too_big()
        keep = self._answer()
        if keep and self.refusal is None and not self.upgrade:
            self._continue()
            return True
        if keep and self.refusal is not None:
            self.server.faults.note(self.refusal.fault, self.address,
                                    self.refusal.reply.status)
            send_all(self.sock, self.server.render(self.refusal.reply, close=True, head=False))
        return False

    def _parse_refusal(self, text: str, data: bytes) -> Refusal:
        """llhttp's refusal as Go answers it: 505 for an HTTP version other than 1.x,
        501 for a Transfer-Encoding other than chunked, 400 for the rest."""
        if text == "Invalid HTTP version" and VERSION.search(data):
            return unsupported_version()
        headers = self.current.headers if self.current is not None else []
        if any(name.lower() == b"transfer-encoding" and value.lower() != b"chunked"
               for name, value in headers) or "`Transfer-Encoding`" in text:
            return unsupported_coding()
        return bad_request(text)

    def _answer(self) -> bool:
        """Run the complete requests in order, answer them in one write; False when
        the connection is to close after them."""
        out = []
        keep = True
        for request in self.complete:
            reply, close = self.server.run(request, self.address)
            keep = request.keep_alive and not close
            out.append(self.server.render(reply, close=not keep, head=request.method == "HEAD",
                                          keep_alive_10=keep and request.version == "1.0"))
            if not keep:
                break
        self.complete.clear()
        if out:
            send_all(self.sock, b"".join(out))
        return keep

    def _continue(self) -> None:
        """100 Continue to a client waiting for it, once earlier answers are out."""
        request = self.current
        if request is not None and request.wants_continue and not request.body:
            request.wants_continue = False
            send_all(self.sock, b"HTTP/1.1 100 Continue\r\n\r\n")


class Http1Server(StreamServer):
    """A WSGI app served over strict HTTP/1.1 (and HTTPS with an ssl_context)."""

    max_accept = MAX_ACCEPT

    def __init__(self, listener, app, body_limit: BodyLimit, ssl_context=None):
        extra = {"ssl_context": ssl_context} if ssl_context else {}
        # a pool, so stop(timeout) lets the requests being served end (without one,
        # gevent only stops accepting, and a stopping broker exited under them)
        super().__init__(listener, self._serve, spawn=Pool(), **extra)
        self.app = app
        self.body_limit = body_limit
        self.scheme = "https" if ssl_context else "http"
        self.faults = ClientFaults(log, "HTTP requests")
        self.port = str(self.socket.getsockname()[1])
        self._date = (0, "")

    def _serve(self, sock, address) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        Connection(self, sock, address).serve()

    def run(self, request: Incoming, address) -> tuple[Reply, bool]:
        """The app's answer, and whether the connection closes after it (the app asked
        for it, or the target could not be read)."""
        try:
            environ = self._environ(request, address)
        except Refusal as refusal:
            self.faults.note(refusal.fault, address, refusal.reply.status)
            return refusal.reply, True
        started: list = []

        def start_response(status, headers, exc_info=None):
            started[:] = [status, headers]

        try:
            chunks = self.app(environ, start_response)
            body = b"".join(chunks)
            getattr(chunks, "close", lambda: None)()
            status, headers = started
        except Exception:
            log.exception("http %s %s failed", request.method, environ["PATH_INFO"])
            return go_error(500, "Internal Server Error"), True
        closing = any(k.lower() == "connection" and v.lower() == "close" for k, v in headers)
        return Reply(status, [(k, v) for k, v in headers if k.lower() != "connection"],
                     body), closing

    def _environ(self, request: Incoming, address) -> dict:
        """PEP 3333's environ of a complete request."""
        path, _, query = request.url.partition(b"?")
        if not path.startswith(b"/"):
            try:
                parsed = httptools.parse_url(request.url)
            except httptools.HttpParserInvalidURLError:
                raise bad_request("invalid URI") from None
            path, query = parsed.path or b"", parsed.query or b""
            if not path.startswith(b"/"):
                raise bad_request("invalid URI")
        if BAD_ESCAPE.search(path):
            raise bad_request("invalid URL escape")
        environ = {
            "REQUEST_METHOD": request.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
            "QUERY_STRING": query.decode("latin-1"),
            "RAW_URI": request.url.decode("latin-1"),
            "SERVER_PROTOCOL": f"HTTP/{request.version}",
            "SERVER_NAME": "", "SERVER_PORT": self.port,
            "REMOTE_ADDR": address[0] if isinstance(address, tuple) else "",
            "REMOTE_PORT": str(address[1]) if isinstance(address, tuple) else "",
            "wsgi.version": (1, 0), "wsgi.url_scheme": self.scheme,
            "wsgi.input": io.BytesIO(b"".join(request.body)), "wsgi.errors": sys.stderr,
            "wsgi.multithread": False, "wsgi.multiprocess": True, "wsgi.run_once": False,
        }
        for name, value in request.headers:
            key = name.decode("latin-1").upper().replace("-", "_")
            key = key if key in ("CONTENT_LENGTH", "CONTENT_TYPE") else "HTTP_" + key
            text = value.decode("latin-1")
            environ[key] = f"{environ[key]}, {text}" if key in environ else text
        return environ

    def render(self, reply: Reply, close: bool, head: bool, keep_alive_10: bool = False) -> bytes:
        """The answer's bytes: status line, headers (Date, Content-Length and Connection
        added), body (none for HEAD)."""
        lines = [f"HTTP/1.1 {reply.status}"]
        length = False
        for name, value in reply.headers:
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"a line break in the header {name!r}")
            length = length or name.lower() == "content-length"
            lines.append(f"{name}: {value}")
        lines.append(f"Date: {self._now()}")
        if not length and not reply.status.startswith(("1", "204", "304")):
            lines.append(f"Content-Length: {len(reply.body)}")
        if close:
            lines.append("Connection: close")
        elif keep_alive_10:
            lines.append("Connection: keep-alive")
        head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head_bytes if head else head_bytes + reply.body

    def _now(self) -> str:
        """The Date header, made once a second."""
        second = int(time.time())
        if self._date[0] != second:
            self._date = (second, email.utils.formatdate(second, usegmt=True))
        return self._date[1]
