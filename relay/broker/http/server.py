"""The WSGI app both HTTP APIs share (nsqd's internal/http_api), served by http1.py.

Responses follow http_api.V1: 200 with the text or JSON, errors as
`{"message":"CODE"}`, 404 NOT_FOUND for unknown paths and 405 METHOD_NOT_ALLOWED
for a known path with the wrong method; paths are routed as nsqd's httprouter does,
with its redirects (301 for GET, 307 else) to the route a path means (`/ping/`,
`//ping`, `/PING`). Bodies are bounded by max-msg-size / max-body-size: the
server refuses a body past its path's limit before reading it (body_limit).
"""

import functools
import html
import logging
import re
from typing import Callable, NamedTuple
from urllib.parse import parse_qs

import orjson
import redis

from relay import codec
from relay.broker.auth import AuthError
from relay.broker.context import BrokerContext
from relay.broker.http.http1 import Http1Server, Reply
from relay.errors import RelayError, StoreError
from relay.sockio import listen
from relay.store.causes import cause

log = logging.getLogger("relay.http")

JSON = "application/json; charset=utf-8"
# With AUTH on, what changes state needs a grant: to publish on the topic, to subscribe
# to the topic and channel, or (PUT /config/...) any grant at all
AUTHORIZED_PATHS = {
    **{p: "publish" for p in ("/pub", "/mpub", "/topic/create", "/topic/delete",
                              "/topic/empty", "/topic/pause", "/topic/unpause",
                              "/topic/tombstone", "/topic/retention", "/topic/ttl",
                              "/topic/dedup", "/topic/order-key")},
    **{p: "subscribe" for p in ("/channel/create", "/channel/delete", "/channel/empty",
                                "/channel/pause", "/channel/unpause", "/channel/replay",
                                "/channel/ttl", "/channel/limit", "/channel/order")}}
IDENTIFIED = "identified"
MAX_CACHED_GRANTS = 10_000
TLS_REQUIRED_EVERYWHERE = 2     # --tls-required true: no plain HTTP API either
REASONS = {200: "OK", 301: "Moved Permanently", 307: "Temporary Redirect",
           400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 413: "Request Entity Too Large",
           500: "Internal Server Error", 503: "Service Unavailable"}
BAD_QUERY = re.compile(r"%(?![0-9A-Fa-f]{2})|;")     # what Go's url.ParseQuery refuses

Routes = dict[str, dict[str, Callable]]     # path -> method -> handler(request)


class HttpError(RelayError):
    """An error reply: `{"message": text}`, or the bare text for plain-text endpoints."""

    def __init__(self, code: int, text: str, plain: bool = False):
        super().__init__(text)
        self.code = code
        self.text = text
        self.plain = plain


class Moved(RelayError):
    """httprouter's redirect to the route a path means."""

    def __init__(self, method: str, location: str):
        super().__init__(location)
        self.code = 301 if method == "GET" else 307
        self.location = location


class Typed(NamedTuple):
    """A body with its own content type."""
    body: bytes
    content_type: str


class Request:
    """One request's path, query arguments and body, decoded with nsqd's error codes."""

    def __init__(self, environ):
        self.environ = environ
        self.method = environ["REQUEST_METHOD"]
        self.path = environ.get("PATH_INFO", "/")
        self.raw_query = environ.get("QUERY_STRING", "")
        self._query: dict[str, list[str]] | None = None
        self.reply_headers: list[tuple[str, str]] = []    # a handler's own, e.g. X-Relay-*

    @property
    def query(self) -> dict[str, list[str]]:
        """The arguments, read when a handler first asks (as nsqd's NewReqParams): a bad
        escape or a semicolon is nsqd's 400 INVALID_REQUEST."""
        if self._query is None:
            if BAD_QUERY.search(self.raw_query):
                raise HttpError(400, "INVALID_REQUEST")
            self._query = parse_qs(self.raw_query, keep_blank_values=True)
        return self._query

    def arg_bytes(self, name: str) -> bytes | None:
        """An argument's bytes as sent (percent-decoded), where arg() would replace
        what is not UTF-8."""
        if name not in self.query:  # refuses a query Go would not parse; an ASCII name
            return None             # absent from it is absent from the latin-1 reading too
        values = parse_qs(self.raw_query, keep_blank_values=True, encoding="latin-1").get(name)
        return values[0].encode("latin-1") if values else None

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None

    def required(self, name: str) -> str:
        """The argument, or nsqd's 400 MISSING_ARG_<NAME>; present but empty counts as given."""
        value = self.arg(name)
        if value is None:
            raise HttpError(400, f"MISSING_ARG_{name.upper()}")
        return value

    def topic(self) -> str:
        """The topic of /pub, /mpub and /topic/*: nsqd calls a bad name INVALID_TOPIC there."""
        name = self.required("topic")
        if not codec.is_valid_name(name):
            raise HttpError(400, "INVALID_TOPIC")
        return name

    def topic_channel(self) -> tuple[str, str]:
        """The topic and channel of /channel/*, where nsqd says INVALID_ARG_TOPIC."""
        topic = self.required("topic")
        if not codec.is_valid_name(topic):
            raise HttpError(400, "INVALID_ARG_TOPIC")
        channel = self.required("channel")
        if not codec.is_valid_name(channel):
            raise HttpError(400, "INVALID_ARG_CHANNEL")
        return topic, channel

    def body(self, limit: int, too_big: str) -> bytes:
        """The body, or 413 too_big past `limit` bytes (the server read it whole, up to
        the path's body_limit)."""
        data = self.environ["wsgi.input"].read(limit + 1)
        if len(data) > limit:
            raise HttpError(413, too_big)
        return data


def from_store(broker, fn):
    """fn(store); a Redis failure answers 500 INTERNAL_ERROR, as any failure inside nsqd."""
    try:
        return fn(broker.store)
    except StoreError as e:
        log.warning("http: %s", e)
        raise HttpError(500, "INTERNAL_ERROR") from None


def from_registry(broker, fn):
    """fn(broker.redis), for the broker registry's plain commands (relay/broker/registry.py);
    a Redis failure answers 500 INTERNAL_ERROR."""
    try:
        return fn(broker.redis)
    except redis.exceptions.RedisError as e:
        log.warning("http: %s", cause(e))
        raise HttpError(500, "INTERNAL_ERROR") from None


def parsed_arg(request: Request, name: str, parse: Callable, invalid: str, default=0):
    """The argument `name` read by `parse`, or 400 `invalid`; `default` when absent."""
    raw = request.arg(name)
    if raw is None or raw == "":
        return default
    try:
        return parse(raw)
    except ValueError:
        raise HttpError(400, invalid) from None


def existing_topic(broker, topic: str) -> str:
    """The topic, or 404 TOPIC_NOT_FOUND: nsqd and nsqlookupd answer only for known topics."""
    if topic not in from_store(broker, lambda s: s.reads.topic_names()):
        raise HttpError(404, "TOPIC_NOT_FOUND")
    return topic


def existing_channel(broker, topic: str, channel: str) -> None:
    """404 TOPIC_NOT_FOUND or CHANNEL_NOT_FOUND unless both are known."""
    existing_topic(broker, topic)
    if channel not in from_store(broker, lambda s: s.reads.channel_names(topic)):
        raise HttpError(404, "CHANNEL_NOT_FOUND")


class HttpServer:
    """One API's routes on one or more listening addresses (nsqd's API also on
    --https-address), with the TLS and Bearer auth checks in front of every route."""

    def __init__(self, broker: BrokerContext, routes: Routes, prefixes: Routes | None = None,
                 body_limits: dict[str, tuple[str, str]] | None = None):
        self.broker = broker
        self.routes = routes
        self.prefixes = prefixes or {}      # routes for every path under a prefix
        self.body_limits = body_limits or {}    # path -> (option, 413 text); else BODY_TOO_BIG
        self.bearer = BearerAuth(broker)
        self.servers: list[Http1Server] = []
        self.port = 0

    def start(self, address: str, ssl_context=None) -> tuple:
        """Serve on address, over TLS with an ssl_context (--https-address)."""
        server = Http1Server(listen(address), self.app, self.body_limit, ssl_context)
        server.start()
        self.servers.append(server)
        bound = server.socket.getsockname()[:2]
        if ssl_context is None:
            self.port = bound[1]
        return bound

    def stop(self) -> None:
        for server in self.servers:
            server.stop(timeout=1)

    def body_limit(self, method: str, path: str) -> tuple[int, Reply]:
        """The most body bytes `path` takes (max-body-size unless body_limits says), and
        nsqd's 413 past them."""
        option, text = self.body_limits.get(path, ("max_body_size", "BODY_TOO_BIG"))
        return getattr(self.broker.options, option), too_big(text)

    def app(self, environ, start_response):
        request = Request(environ)
        code, data = self._answer(request)
        status, headers, body = encode(code, data)
        headers += request.reply_headers
        if code == 405 or request.method == "OPTIONS":
            allowed = self._allowed(request)
            if allowed:
                headers.append(("Allow", allowed))
        start_response(status, headers)
        return [] if request.method == "HEAD" else [body]

    def _answer(self, request: Request) -> tuple:
        """(status code, data) of the request; no exception escapes to the client."""
        try:
            self._check_tls(request)
            handler = self._handler(request)
            if request.method != "OPTIONS":
                self.bearer.check(request)
            return 200, handler(request)
        except Moved as e:
            request.reply_headers.append(("Location", e.location))
            if request.method != "GET":
                return e.code, None
            link = f'<a href="{html.escape(e.location)}">{REASONS[e.code]}</a>.\n\n'
            return e.code, Typed(link.encode(), "text/html; charset=utf-8")
        except HttpError as e:
            return e.code, e.text if e.plain else {"message": e.text}
        except Exception:
            log.exception("http %s %s failed", request.method, request.path)
            return 500, {"message": "INTERNAL_ERROR"}

    def _check_tls(self, request: Request) -> None:
        """--tls-required true leaves only /ping on plain HTTP, as nsqd."""
        if (self.broker.options.tls_required == TLS_REQUIRED_EVERYWHERE
                and request.path != "/ping"
                and request.environ.get("wsgi.url_scheme") != "https"):
            raise HttpError(403, "TLS_REQUIRED")

    def _methods(self, path: str) -> dict | None:
        """The path's handlers by method, None for an unknown path."""
        methods = self.routes.get(path)
        for prefix, by_method in self.prefixes.items():
            if path.startswith(prefix) and len(path) > len(prefix):
                methods = by_method
        return methods

    def _moved(self, request: Request) -> Moved | None:
        """httprouter's redirect for a path no route has: to the path with its trailing
        slash toggled, or to the cleaned path in any case ("//ping", "/../PING")."""
        path = request.path
        if request.method == "CONNECT" or path == "/":
            return None
        toggled = path[:-1] if path.endswith("/") else path + "/"
        cleaned = clean_path(path).lower()
        for target in (toggled, cleaned, cleaned[:-1] if cleaned.endswith("/") else cleaned + "/"):
            if target != path and request.method in (self._methods(target) or {}):
                query = f"?{request.raw_query}" if request.raw_query else ""
                return Moved(request.method, target + query)
        return None

    def _allowed(self, request: Request) -> str:
        """The Allow header of the path as nsqd's router gives it ("" when unknown)."""
        methods = self._methods(request.path)
        return ", ".join(sorted({*methods, "OPTIONS"})) if methods else ""

    def _handler(self, request: Request) -> Callable:
        """The route's handler: 404 for an unknown path, 405 for a known one's wrong
        method; OPTIONS on a known path answers 200 with nothing (and Allow, see app)."""
        methods = self._methods(request.path)
        handler = (methods or {}).get(request.method)
        moved = None if handler else self._moved(request)
        if moved:
            raise moved
        if methods is None:
            raise HttpError(404, "NOT_FOUND")
        if handler is None and request.method == "OPTIONS":
            return lambda request: None
        if handler is None:
            raise HttpError(405, "METHOD_NOT_ALLOWED")
        return handler


@functools.cache
def too_big(text: str) -> Reply:
    """nsqd's 413 with its message."""
    return Reply(*encode(413, {"message": text}))


def clean_path(path: str) -> str:
    """httprouter's CleanPath: one slash between segments, "." and ".." resolved, a
    trailing slash kept."""
    parts: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            parts = parts[:-1]
        elif segment not in ("", "."):
            parts.append(segment)
    cleaned = "/" + "/".join(parts)
    return cleaned + "/" if path.endswith("/") and cleaned != "/" else cleaned


def encode(code: int, data) -> tuple[str, list, bytes]:
    """(status, headers, body) of a handler's answer: text, bytes, None (empty), a Typed
    body, or anything else as compact JSON, each with nsqd's v1 content-type header."""
    headers = [("X-NSQ-Content-Type", "nsq; version=1.0")]
    if isinstance(data, Typed):
        headers.append(("Content-Type", data.content_type))
        data = data.body
    if isinstance(data, str):
        body = data.encode()
    elif data is None:
        body = b""
    elif isinstance(data, bytes):
        body = data
    else:
        body = json_bytes(data)
        headers.append(("Content-Type", JSON))
    headers.append(("Content-Length", str(len(body))))
    return f"{code} {REASONS.get(code, '')}", headers, body


def json_bytes(data) -> bytes:
    """Compact JSON, UTF-8 (non-ASCII not escaped, as Go writes it)."""
    return orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS)


class BearerAuth:
    """AUTH on the HTTP API (beyond nsqd, whose HTTP API has none): the grant of each
    secret is kept for its ttl, so a busy publisher does not ask the auth server each time."""

    def __init__(self, broker: BrokerContext):
        self.broker = broker
        self._grants: dict = {}     # (secret, tls, address) -> auth Grant, for its ttl

    def check(self, request: Request) -> None:
        """With AUTH on, publishing and topic/channel changes need `Authorization: Bearer
        <secret>` granting publish on the topic or subscribe on the topic and channel;
        PUT /config/... a secret with any grant."""
        if not self.broker.auth.enabled:
            return
        kind = AUTHORIZED_PATHS.get(request.path)
        if request.method == "PUT" and request.path.startswith("/config/"):
            kind = IDENTIFIED
        topic = request.arg("topic")
        if kind is None or (topic is None and kind != IDENTIFIED):
            return      # nothing to change: the handler answers MISSING_ARG_TOPIC
        scheme, _, secret = request.environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() != "bearer" or not secret:
            raise HttpError(401, "AUTH_REQUIRED")
        grant = self._grant(request, secret)
        if kind == IDENTIFIED:
            if not grant.authorizations:
                raise HttpError(403, "UNAUTHORIZED")
            return
        channel = (request.arg("channel") or "") if kind == "subscribe" else ""
        if kind == "subscribe" and not channel:
            return      # the handler answers MISSING_ARG_CHANNEL
        if not grant.allows(topic, channel):
            raise HttpError(403, "UNAUTHORIZED")

    def _grant(self, request: Request, secret: str):
        """The secret's grant for this client: asked per secret, TLS and address, as an
        auth server may answer each differently (TCP asks per connection)."""
        tls = request.environ.get("wsgi.url_scheme") == "https"
        address = request.environ.get("REMOTE_ADDR", "")
        grant = self._grants.get((secret, tls, address))
        if grant is None or grant.expired:
            try:
                grant = self.broker.auth.grant(secret, address, tls, "")
            except AuthError as e:
                log.warning("http: AUTH failed: %s", e)
                raise HttpError(503, "AUTH_FAILED") from None
            if len(self._grants) >= MAX_CACHED_GRANTS:
                self._grants.clear()
            self._grants[(secret, tls, address)] = grant
        return grant
