"""nsqd's HTTP API (nsqd/http.go, internal/http_api), served by gevent's WSGI server.

Responses follow http_api.V1: 200 with the text or JSON, errors as
`{"message":"CODE"}`, 404 NOT_FOUND for unknown paths and 405 METHOD_NOT_ALLOWED
for a known path with the wrong method. Bodies are bounded by max-msg-size /
max-body-size: a declared Content-Length over the limit is refused before
reading, and a chunked body is read only up to the limit plus one byte.
"""

import dataclasses
import json
import logging
import socket
import time
from typing import NamedTuple
from urllib.parse import parse_qs

import redis
from gevent.pywsgi import WSGIServer

from relay import codec, stats
from relay.auth import AuthError
from relay.codec import NSQD_VERSION, split_mpub
from relay.errors import ClientError, RelayError, StoreError
from relay.metrics import CONTENT_TYPE
from relay.options import DURATION
from relay.registry import live_brokers
from relay.sockio import listen

log = logging.getLogger("relay.http")

BOOLS = {"true": True, "1": True, "false": False, "0": False}
JSON = "application/json; charset=utf-8"
AUTHORIZED_PATHS = {
    **{p: "publish" for p in ("/pub", "/mpub", "/topic/create", "/topic/delete",
                              "/topic/empty", "/topic/pause", "/topic/unpause")},
    **{p: "subscribe" for p in ("/channel/create", "/channel/delete", "/channel/empty",
                                "/channel/pause", "/channel/unpause")}}
MAX_CACHED_GRANTS = 10_000
LOG_LEVELS = ("debug", "info", "warning", "error")
TLS_REQUIRED_EVERYWHERE = 2     # --tls-required true: no plain HTTP API either
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
           404: "Not Found",
           405: "Method Not Allowed",
           413: "Request Entity Too Large", 500: "Internal Server Error",
           503: "Service Unavailable"}


class HttpError(RelayError):
    """An error reply: `{"message": text}`, or the bare text for plain-text endpoints."""

    def __init__(self, code: int, text: str, plain: bool = False):
        super().__init__(text)
        self.code = code
        self.text = text
        self.plain = plain


class Typed(NamedTuple):
    """A body with its own content type."""
    body: bytes
    content_type: str


class Request:
    def __init__(self, environ):
        self.environ = environ
        self.method = environ["REQUEST_METHOD"]
        self.path = environ.get("PATH_INFO", "/")
        self.query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None

    def required(self, name: str) -> str:
        """The argument, or nsqd's 400 MISSING_ARG_<NAME>; present but empty counts as given."""
        value = self.arg(name)
        if value is None:
            raise HttpError(400, f"MISSING_ARG_{name.upper()}")
        return value

    def body(self, limit: int, too_big: str) -> bytes:
        """The body, or 413 too_big past `limit` bytes, without reading more than limit+1."""
        declared = self.environ.get("CONTENT_LENGTH")
        if declared and declared.isdigit() and int(declared) > limit:
            raise HttpError(413, too_big)
        data = self.environ["wsgi.input"].read(limit + 1)
        if len(data) > limit:
            raise HttpError(413, too_big)
        return data


class HttpApi:
    """The nsqd endpoints of one broker."""

    def __init__(self, broker):
        self.broker = broker
        self.options = broker.options
        self.start_time = int(time.time())
        self.routes = {
            "/ping": {"GET": self.ping},
            "/info": {"GET": self.info},
            "/pub": {"POST": self.pub},
            "/mpub": {"POST": self.mpub},
            "/stats": {"GET": self.stats},
            "/topic/create": {"POST": self.topic_create},
            "/topic/delete": {"POST": self.topic_delete},
            "/topic/empty": {"POST": self.topic_empty},
            "/topic/pause": {"POST": self.topic_pause},
            "/topic/unpause": {"POST": self.topic_pause},
            "/channel/create": {"POST": self.channel_create},
            "/channel/delete": {"POST": self.channel_delete},
            "/channel/empty": {"POST": self.channel_empty},
            "/lookup": {"GET": self.lookup},
            "/topics": {"GET": self.topics},
            "/channels": {"GET": self.channels},
            "/nodes": {"GET": self.nodes},
            "/metrics": {"GET": self.metrics},
            "/channel/pause": {"POST": self.channel_pause},
            "/channel/unpause": {"POST": self.channel_pause},
        }
        self.prefixes = {"/config/": {"GET": self.config, "PUT": self.config}}
        self.servers: list[WSGIServer] = []
        self.port = 0
        self._grants: dict = {}     # (secret, tls) -> auth Grant, for its ttl

    def start(self, address: str, ssl_context=None) -> tuple:
        """Serve on address, over TLS with an ssl_context (--https-address)."""
        extra = {"ssl_context": ssl_context} if ssl_context else {}
        server = WSGIServer(listen(address), self.app, log=None, error_log=log, **extra)
        server.start()
        self.servers.append(server)
        address = server.socket.getsockname()[:2]
        if ssl_context is None:
            self.port = address[1]
        return address

    def stop(self) -> None:
        for server in self.servers:
            server.stop(timeout=1)

    # -- WSGI --------------------------------------------------------------------

    def app(self, environ, start_response):
        request = Request(environ)
        methods = self.routes.get(request.path.rstrip("/") or "/")
        for prefix, by_method in self.prefixes.items():
            if request.path.startswith(prefix) and len(request.path) > len(prefix):
                methods = by_method
        try:
            if (self.options.tls_required == TLS_REQUIRED_EVERYWHERE and request.path != "/ping"
                    and environ.get("wsgi.url_scheme") != "https"):
                raise HttpError(403, "TLS_REQUIRED")
            if methods is None:
                raise HttpError(404, "NOT_FOUND")
            handler = methods.get(request.method)
            if handler is None:
                raise HttpError(405, "METHOD_NOT_ALLOWED")
            self._authorize(request)
            code, data = 200, handler(request)
        except HttpError as e:
            code, data = e.code, e.text if e.plain else {"message": e.text}
        except Exception:
            log.exception("http %s %s failed", request.method, request.path)
            code, data = 500, {"message": "INTERNAL_ERROR"}
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
            body = json.dumps(data, separators=(",", ":")).encode()
            headers.append(("Content-Type", JSON))
        headers.append(("Content-Length", str(len(body))))
        start_response(f"{code} {REASONS.get(code, '')}", headers)
        return [body]

    # -- AUTH (beyond nsqd, whose HTTP API has none) --------------------------------

    def _authorize(self, request) -> None:
        """With AUTH on, publishing and topic/channel changes need `Authorization: Bearer
        <secret>` granting publish on the topic or subscribe on the topic and channel."""
        kind = AUTHORIZED_PATHS.get(request.path.rstrip("/"))
        topic = request.arg("topic")
        if not self.broker.auth.enabled or kind is None or topic is None:
            return
        scheme, _, secret = request.environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() != "bearer" or not secret:
            raise HttpError(401, "AUTH_REQUIRED")
        channel = (request.arg("channel") or "") if kind == "subscribe" else ""
        if kind == "subscribe" and not channel:
            return      # the handler answers MISSING_ARG_CHANNEL
        if not self._grant(request, secret).allows(topic, channel):
            raise HttpError(403, "UNAUTHORIZED")

    def _grant(self, request, secret: str):
        tls = request.environ.get("wsgi.url_scheme") == "https"
        grant = self._grants.get((secret, tls))
        if grant is None or grant.expired:
            try:
                grant = self.broker.auth.grant(secret, request.environ.get("REMOTE_ADDR", ""),
                                               tls, "")
            except AuthError as e:
                log.warning("http: AUTH failed: %s", e)
                raise HttpError(503, "AUTH_FAILED") from None
            if len(self._grants) >= MAX_CACHED_GRANTS:
                self._grants.clear()
            self._grants[(secret, tls)] = grant
        return grant

    # -- endpoints -----------------------------------------------------------------

    def health(self) -> str | None:
        """None when Redis answers, else the reason."""
        try:
            self.broker.redis.ping()
        except Exception as e:  # noqa: BLE001 - any failure is reported as unhealthy
            return f"NOK - {e}"
        return None

    def ping(self, request):
        problem = self.health()
        if problem:
            raise HttpError(500, problem, plain=True)
        return "OK"

    def info(self, request):
        o = self.options
        return {"version": NSQD_VERSION, "broadcast_address": o.broadcast_address,
                "hostname": socket.gethostname(),
                "http_port": self.port,
                "tcp_port": self.broker.tcp_port, "start_time": self.start_time,
                "max_heartbeat_interval": o.max_heartbeat_interval * 1_000_000,
                "max_output_buffer_size": o.max_output_buffer_size,
                "max_output_buffer_timeout": o.max_output_buffer_timeout * 1_000_000,
                "max_deflate_level": o.max_deflate_level}

    def _topic(self, request) -> str:
        name = request.required("topic")
        if not codec.is_valid_name(name):
            raise HttpError(400, "INVALID_TOPIC")
        return name

    def _topic_channel(self, request) -> tuple[str, str]:
        topic = request.required("topic")
        if not codec.is_valid_name(topic):
            raise HttpError(400, "INVALID_ARG_TOPIC")
        channel = request.required("channel")
        if not codec.is_valid_name(channel):
            raise HttpError(400, "INVALID_ARG_CHANNEL")
        return topic, channel

    def _publish(self, topic: str, bodies: list, defer: int = 0) -> str:
        broker = self.broker
        try:
            broker.commit.call(broker.store.publish_op(topic, bodies, defer))
        except StoreError as e:
            log.warning("http publish to %s failed: %s", topic, e)
            raise HttpError(503, "EXITING") from None
        broker.metrics.published.inc(len(bodies))
        return "OK"

    def pub(self, request):
        body = request.body(self.options.max_msg_size, "MSG_TOO_BIG")
        if not body:
            raise HttpError(400, "MSG_EMPTY")
        topic = self._topic(request)
        defer = 0
        raw = request.arg("defer")
        if raw is not None:
            try:
                defer = int(raw)
            except ValueError:
                raise HttpError(400, "INVALID_DEFER") from None
            if not 0 <= defer <= self.options.max_req_timeout:
                raise HttpError(400, "INVALID_DEFER")
        return self._publish(topic, [body], defer)

    def mpub(self, request):
        declared = request.environ.get("CONTENT_LENGTH")
        if declared and declared.isdigit() and int(declared) > self.options.max_body_size:
            raise HttpError(413, "BODY_TOO_BIG")
        topic = self._topic(request)
        raw = request.arg("binary")
        binary = raw is not None and BOOLS.get(raw, True)
        body = request.body(self.options.max_body_size, "BODY_TOO_BIG")
        if binary:
            try:
                bodies = split_mpub(body, self.options.max_body_size, self.options.max_msg_size)
            except ClientError as e:
                raise HttpError(413, e.code[2:]) from None
        else:
            bodies = [line for line in body.split(b"\n") if line]
            if any(len(b) > self.options.max_msg_size for b in bodies):
                raise HttpError(413, "MSG_TOO_BIG")
        if not bodies:
            return "OK"
        return self._publish(topic, bodies)

    def topic_create(self, request):
        topic = self._topic(request)
        self._store(lambda s: s.create_topic(topic))

    def topic_delete(self, request):
        topic = request.required("topic")
        if not self._store(lambda s: s.delete_topic(topic)):
            raise HttpError(404, "TOPIC_NOT_FOUND")

    def topic_empty(self, request):
        topic = self._existing_topic(self._topic(request))
        self._store(lambda s: s.empty_topic(topic))

    def topic_pause(self, request):
        topic = request.required("topic")
        self._existing_topic(topic)
        self._store(lambda s: s.pause_topic(topic, _pausing(request)))

    def channel_create(self, request):
        topic, channel = self._topic_channel(request)
        self._existing_topic(topic)
        self._store(lambda s: s.create_channel(topic, channel))

    def channel_delete(self, request):
        topic, channel = self._topic_channel(request)
        self._existing_topic(topic)
        if not self._store(lambda s: s.delete_channel(topic, channel)):
            raise HttpError(404, "CHANNEL_NOT_FOUND")

    def channel_empty(self, request):
        topic, channel = self._existing_channel(request)
        self._store(lambda s: s.empty_channel(topic, channel))

    def channel_pause(self, request):
        topic, channel = self._existing_channel(request)
        self._store(lambda s: s.pause_channel(topic, channel, _pausing(request)))

    def _existing_channel(self, request) -> tuple[str, str]:
        topic, channel = self._topic_channel(request)
        self._existing_topic(topic)
        if channel not in self._store(lambda s: s.channel_names(topic)):
            raise HttpError(404, "CHANNEL_NOT_FOUND")
        return topic, channel

    def _existing_topic(self, topic: str) -> str:
        if topic not in self._store(lambda s: s.topic_names()):
            raise HttpError(404, "TOPIC_NOT_FOUND")
        return topic

    def config(self, request):
        """GET /config/:opt: an option by its config name; durations in ns as nsqd's JSON.
        PUT changes log_level at run time, the one option nsqd's PUT has that relay uses."""
        name = request.path[len("/config/"):]
        spec = {f.name: f for f in dataclasses.fields(self.broker.options)}.get(name)
        if spec is None or spec.metadata.get("secret"):
            raise HttpError(400, "INVALID_OPTION")
        if request.method == "PUT":
            self._set_option(name, request.body(self.options.max_msg_size, "INVALID_VALUE"))
        value = getattr(self.broker.options, name)
        if spec.metadata.get("kind") == DURATION:
            value *= 1_000_000
        return Typed(json.dumps(value).encode(), JSON)

    def _set_option(self, name: str, body: bytes) -> None:
        if name != "log_level":
            raise HttpError(400, "INVALID_OPTION")
        if not body:
            raise HttpError(413, "INVALID_VALUE")
        level = body.decode("latin-1").strip().lower()
        level = {"warn": "warning"}.get(level, level)
        if level not in LOG_LEVELS:
            raise HttpError(400, "INVALID_VALUE")
        logging.getLogger().setLevel(level.upper())
        self.broker.options = dataclasses.replace(self.broker.options, log_level=level)

    def metrics(self, request):
        return Typed(self._store(lambda s: self.broker.metrics.render()), CONTENT_TYPE)

    # -- nsqlookupd's questions, answered from the broker registry ----------------

    def lookup(self, request):
        topic = request.required("topic")
        self._existing_topic(topic)
        return {"channels": self._store(lambda s: s.channel_names(topic)),
                "producers": [_peer(b) for b in self._brokers()]}

    def topics(self, request):
        return {"topics": self._store(lambda s: s.topic_names())}

    def channels(self, request):
        topic = request.required("topic")
        return {"channels": self._store(lambda s: s.channel_names(topic))}

    def nodes(self, request):
        topics = self._store(lambda s: s.topic_names())
        return {"producers": [{**_peer(b), "tombstones": [False] * len(topics), "topics": topics}
                              for b in self._brokers()]}

    def _brokers(self) -> list:
        try:
            return live_brokers(self.broker.redis)
        except redis.exceptions.RedisError as e:
            log.warning("http: %s", e)
            raise HttpError(500, "INTERNAL_ERROR") from None

    def _store(self, fn):
        try:
            return fn(self.broker.store)
        except StoreError as e:
            log.warning("http: %s", e)
            raise HttpError(500, "INTERNAL_ERROR") from None

    def stats(self, request):
        topic, channel = request.arg("topic"), request.arg("channel")
        include_clients = BOOLS.get(request.arg("include_clients") or "", True)
        self.broker.flush_latency()
        data = self._store(lambda s: stats.collect(s, topic, channel, self.broker.e2e))
        clients = self._clients() if include_clients else {}
        for t in data["topics"]:
            for c in t["channels"]:
                c["clients"] = clients.get((t["topic_name"], c["channel_name"]), [])
        health = self.health() or "OK"
        producers = [stats.producer_stats(c) for c in list(self.broker.clients.values())
                     if c.pub_counts] if include_clients else []
        if request.arg("format") != "json":
            return stats.text(data, health, self.start_time, producers)
        return {"version": NSQD_VERSION, "health": health, "start_time": self.start_time,
                "topics": data["topics"], "producers": producers}

    def _clients(self) -> dict:
        """This broker's consumers, by (topic, channel), in nsqd's ClientStats shape."""
        out: dict = {}
        for client in self.broker.subscribed_clients():
            channel = client.channel
            out.setdefault((channel.topic, channel.name), []).append(stats.client_stats(client))
        return out


def _peer(broker: dict) -> dict:
    """nsqlookupd's PeerInfo of a registered broker."""
    return {"remote_address": broker["remote_address"], "hostname": broker["hostname"],
            "broadcast_address": broker["broadcast_address"],
            "tcp_port": int(broker["tcp_port"]), "http_port": int(broker["http_port"]),
            "version": broker["version"]}


def _pausing(request) -> bool:
    """/pause or /unpause (nsqd tells them apart the same way)."""
    return not request.path.rstrip("/").endswith("unpause")


class LookupdApi(HttpApi):
    """nsqlookupd's HTTP API alone (nsqlookupd/http.go), for --lookupd-http-address."""

    def __init__(self, broker):
        super().__init__(broker)
        self.routes = {
            "/ping": {"GET": lambda request: "OK"},
            "/info": {"GET": lambda request: {"version": NSQD_VERSION}},
            "/lookup": {"GET": self.lookup}, "/topics": {"GET": self.topics},
            "/channels": {"GET": self.channels}, "/nodes": {"GET": self.nodes},
            "/topic/create": {"POST": self.topic_create},
            "/topic/delete": {"POST": self.lookupd_topic_delete},
            "/channel/create": {"POST": self.lookupd_channel_create},
            "/channel/delete": {"POST": self.lookupd_channel_delete},
        }
        self.prefixes = {}

    def lookupd_topic_delete(self, request):
        """nsqlookupd answers 200 whether or not the topic was registered."""
        topic = request.required("topic")
        self._store(lambda s: s.delete_topic(topic))

    def lookupd_channel_create(self, request):
        topic, channel = self._topic_channel(request)
        self._store(lambda s: (s.create_topic(topic), s.create_channel(topic, channel)))

    def lookupd_channel_delete(self, request):
        topic, channel = self._topic_channel(request)
        if not self._store(lambda s: s.delete_channel(topic, channel)):
            raise HttpError(404, "CHANNEL_NOT_FOUND")
