"""nsqd's HTTP API (nsqd/http.go) of one broker, with nsqlookupd's queries on the same port.

The errors and their order are nsqd's: a request is checked argument by argument as
nsqd checks it, so a client sees the same first error.
"""

import dataclasses
import json
import logging
import socket
import time
from contextlib import contextmanager

from relay.broker import registry
from relay.broker.client import client_stats, producer_stats
from relay.store import stats
from relay.store.causes import cause
from relay.store.dedup import BadKeyedMessage, key_problem
from relay.store.ordering import order_key_problem, split_keyed_forms
from relay.store.priorities import parse_priority
from relay.codec import NSQD_VERSION, parse_int64, split_lines, split_mpub
from relay.broker.context import BrokerContext
from relay.errors import ClientError, OutcomeUnknown, StoreError, publish_outcome
from relay.broker.http.controls import ControlsApi
from relay.broker.http.history import HistoryApi
from relay.broker.http.lookupd import LookupdApi
from relay.broker.http.server import (JSON, HttpError, HttpServer, Routes, Typed,
                                      existing_channel, existing_topic, from_registry,
                                      from_store, json_bytes)
from relay.broker.http.shared import SharedReads
from relay.broker.metrics import CONTENT_TYPE
from relay.log import LEVELS, set_level
from relay.options import DURATION
from relay.sockio import Turns

log = logging.getLogger("relay.http")

BOOLS = {"true": True, "1": True, "false": False, "0": False}
DUPLICATES_HEADER = "X-Relay-Duplicates"
OUTCOME_HEADER = "X-Relay-Outcome"     # of a publish answered 503: failed, or unknown


def nsqd_server(broker: BrokerContext) -> HttpServer:
    """The server of --http-address and --https-address: nsqd's API and nsqlookupd's
    queries, so a client can use a broker as its lookupd."""
    api = NsqdApi(broker)
    return HttpServer(broker, {**api.routes(), **LookupdApi(broker).queries(),
                               **HistoryApi(broker).routes(), **ControlsApi(broker).routes()},
                      prefixes={"/config/": {"GET": api.config, "PUT": api.config}},
                      body_limits={"/pub": ("max_msg_size", "MSG_TOO_BIG"),
                                   "/mpub": ("max_body_size", "BODY_TOO_BIG")})


class NsqdApi:
    """nsqd's endpoints of one broker."""

    def __init__(self, broker: BrokerContext):
        self.broker = broker
        self.options = broker.options
        self.start_time = int(time.time())
        self.shared = SharedReads()

    def routes(self) -> Routes:
        return {
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
            "/channel/pause": {"POST": self.channel_pause},
            "/channel/unpause": {"POST": self.channel_pause},
            "/metrics": {"GET": self.metrics},
        }

    def health(self) -> str | None:
        """None when Redis answers and takes writes, else the reason (nsqd's health
        after a failed write: "NOK - " and why)."""
        try:
            self.broker.redis.ping()
            refusal = self.broker.store.reads.refusal()
        except Exception as e:  # noqa: BLE001 - any failure is reported as unhealthy
            return f"NOK - {cause(e)}"
        return None if refusal is None else f"NOK - {refusal}"

    def ping(self, request):
        problem = self.health()
        if problem:
            raise HttpError(500, problem, plain=True)
        return "OK"

    def info(self, request):
        """http_port is the plain HTTP port, also when asked over HTTPS (as nsqd)."""
        o = self.options
        return {"version": NSQD_VERSION, "broadcast_address": o.broadcast_address,
                "hostname": socket.gethostname(),
                "http_port": self.broker.http.port,
                "tcp_port": self.broker.tcp_port, "start_time": self.start_time,
                "max_heartbeat_interval": o.max_heartbeat_interval * 1_000_000,
                "max_output_buffer_size": o.max_output_buffer_size,
                "max_output_buffer_timeout": o.max_output_buffer_timeout * 1_000_000,
                "max_deflate_level": o.max_deflate_level}

    # -- publishing ----------------------------------------------------------------

    def pub(self, request):
        body = request.body(self.options.max_msg_size, "MSG_TOO_BIG")
        if not body:
            raise HttpError(400, "MSG_EMPTY")
        topic = request.topic()
        with self._made_if_refused(request, topic):
            defer = self._defer(request)
            key = request.arg_bytes("id")
            problem = key_problem(key) if key is not None else None
            if problem:
                raise HttpError(400, problem)
            order_key = self._order_key(request)
            priority = self._priority(request)
        return self._publish(request, topic, [body], defer, None if key is None else [key],
                             None if order_key is None else [order_key], priority)

    @staticmethod
    def _order_key(request) -> bytes | None:
        """The order key of `key=` (relay/store/ordering.py), or None."""
        key = request.arg_bytes("key")
        problem = order_key_problem(key) if key is not None else None
        if problem:
            raise HttpError(400, problem)
        return key

    def _priority(self, request) -> int | None:
        """The priority of `priority=` (relay/store/priorities.py), or None; above 0 only
        once data layout 5 is in force."""
        raw = request.arg("priority")
        if raw is None:
            return None
        try:
            priority = parse_priority(raw)
        except ValueError:
            raise HttpError(400, "INVALID_PRIORITY") from None
        if priority and not self.broker.prioritized:
            raise HttpError(400, "PRIORITIES_NEED_UPGRADE")
        return priority

    def _defer(self, request) -> int:
        raw = request.arg("defer")
        if raw is None:
            return 0
        try:
            defer = parse_int64(raw)
        except ValueError:
            raise HttpError(400, "INVALID_DEFER") from None
        if not 0 <= defer <= self.options.max_defer_timeout:
            raise HttpError(400, "INVALID_DEFER")
        return defer

    def mpub(self, request):
        topic = request.topic()
        with self._made_if_refused(request, topic):
            bodies, publish_keys, order_keys = self._mpub_messages(request)
            priority = self._priority(request)
        if not bodies:
            self._create(request, topic)
            return "OK"
        return self._publish(request, topic, bodies, 0, publish_keys, order_keys, priority)

    def _mpub_messages(self, request) -> tuple[list, list | None, list | None]:
        """The bodies of an /mpub, their publish keys with keyed=true, and their order
        keys: each its own with ordered=true, or all key=."""
        one_key = self._order_key(request)
        raw = request.arg("binary")
        binary = raw is not None and BOOLS.get(raw, True)
        body = request.body(self.options.max_body_size, "BODY_TOO_BIG")
        turn = Turns().take
        if binary:
            try:
                bodies = split_mpub(body, self.options.max_body_size, self.options.max_msg_size,
                                    turn)
            except ClientError as e:
                raise HttpError(413, e.code[2:]) from None
        else:
            lines = split_lines(body, self.options.max_msg_size, turn)
            if lines is None:
                raise HttpError(413, "MSG_TOO_BIG")
            bodies = lines
        keyed, ordered = (self._flag(request, name) for name in ("keyed", "ordered"))
        if ordered and one_key is not None:
            raise HttpError(400, "INVALID_ARG_KEY")     # key= or a key per message
        if not bodies:
            return bodies, None, None
        try:
            bodies, publish_keys, order_keys = split_keyed_forms(bodies, keyed, ordered)
        except BadKeyedMessage as e:
            raise HttpError(400, e.code) from None
        return bodies, publish_keys, [one_key] * len(bodies) if one_key else order_keys

    @staticmethod
    def _flag(request, name: str) -> bool:
        raw = request.arg(name)
        return raw is not None and BOOLS.get(raw, True)

    @contextmanager
    def _made_if_refused(self, request, topic: str):
        """nsqd's getTopicFromQuery creates the topic before the arguments and body after
        it are checked, so a publish refused there leaves the topic; one that goes ahead
        creates it itself, without a call of its own."""
        try:
            yield
        except HttpError:
            self._create(request, topic)
            raise

    def _create(self, request, topic: str) -> None:
        self._publishing(request, topic, lambda: self.broker.store.control.create_topic(topic),
                         before=True)

    def _publish(self, request, topic: str, bodies: list, defer: int = 0,
                 publish_keys: list | None = None, order_keys: list | None = None,
                 priority: int | None = None) -> str:
        """Publish, with publish keys (relay/store/dedup.py) "OK" all the same, and how
        many were duplicates, not published, in the header X-Relay-Duplicates; with order
        keys, given or by the topic's rule (relay/store/ordering.py): the one path of
        publishes (relay/broker/publishing.py)."""
        publishing = self.broker.publishing
        result = self._publishing(request, topic, lambda: publishing.submit(
            topic, bodies, defer, publish_keys, order_keys, priority=priority), before=True)
        duplicates = publishing.published(len(bodies), publish_keys,
                                          self._publishing(request, topic, result.get))
        if publish_keys is not None:
            request.reply_headers.append((DUPLICATES_HEADER, str(duplicates)))
        return "OK"

    @staticmethod
    def _publishing(request, topic: str, step, before: bool = False):
        """A step of a publish, and what it returns; Redis failing is a 503, as nsqd's
        failed publish, with the cause (nsqd's text, EXITING, would say the broker is
        shutting down). X-Relay-Outcome says `unknown` where the messages may have been
        published all the same (never `before` they were handed to Redis), else `failed`."""
        try:
            return step()
        except StoreError as e:
            unknown = not before and isinstance(e, OutcomeUnknown)
            log.warning("http publish to %s %s", topic,
                        publish_outcome(e) if unknown else f"failed: {e}")
            request.reply_headers.append((OUTCOME_HEADER, "unknown" if unknown else "failed"))
            raise HttpError(503, publish_outcome(e) if unknown else str(e)) from None

    # -- topics and channels -------------------------------------------------------

    def topic_create(self, request):
        topic = request.topic()
        from_store(self.broker, lambda s: s.control.create_topic(topic))

    def topic_delete(self, request):
        """On a broker tombstoned for the topic (nsqadmin's "tombstone" sends this right
        after /topic/tombstone), only this broker's share goes: its consumers of the topic
        are closed, to find the other brokers through /lookup; the messages, shared by
        every broker, stay."""
        topic = request.required("topic")
        if self._tombstoned(topic):
            existing_topic(self.broker, topic)
            for client in self.broker.subscribed_clients():
                assert client.channel is not None   # subscribed_clients() have one
                if client.channel.topic == topic:
                    client.close()
            return
        if not from_store(self.broker, lambda s: s.control.delete_topic(topic)) \
                and not self._deregistered(topic, ""):
            raise HttpError(404, "TOPIC_NOT_FOUND")

    def _deregistered(self, topic: str, channel: str) -> bool:
        """nsqadmin sends a delete to every producer after the lookupd's: on relay's brokers,
        which share one copy, the first deletes it and the others find it gone. Once
        relay's lookupd forgot it (lookupd.py), they answer 200 too, as each nsqd would."""
        return from_registry(self.broker, lambda r: registry.deregistered(r, topic, channel))

    def _tombstoned(self, topic: str) -> bool:
        address = f"{self.options.broadcast_address}:{self.broker.http.port}"
        return address in from_registry(self.broker,
                                        lambda r: registry.tombstoned(r, [topic])[topic])

    def topic_empty(self, request):
        topic = existing_topic(self.broker, request.topic())
        from_store(self.broker, lambda s: s.control.empty_topic(topic))

    def topic_pause(self, request):
        topic = existing_topic(self.broker, request.required("topic"))
        from_store(self.broker, lambda s: s.control.pause_topic(topic, _pausing(request)))

    def channel_create(self, request):
        """from=earliest (relay's): a new channel with everything the topic retains."""
        topic, channel = request.topic_channel()
        existing_topic(self.broker, topic)
        start = request.arg("from")
        if start not in (None, "latest", "earliest"):
            raise HttpError(400, "INVALID_ARG_FROM")
        if start == "earliest":
            return HistoryApi(self.broker).create_from_start(topic, channel)
        from_store(self.broker, lambda s: s.control.create_channel(topic, channel))

    def channel_delete(self, request):
        topic, channel = request.topic_channel()
        existing_topic(self.broker, topic)
        if not from_store(self.broker, lambda s: s.control.delete_channel(topic, channel)) \
                and not self._deregistered(topic, channel):
            raise HttpError(404, "CHANNEL_NOT_FOUND")

    def channel_empty(self, request):
        topic, channel = self._existing_channel(request)
        from_store(self.broker, lambda s: s.control.empty_channel(topic, channel))

    def channel_pause(self, request):
        topic, channel = self._existing_channel(request)
        from_store(self.broker, lambda s: s.control.pause_channel(topic, channel, _pausing(request)))

    def _existing_channel(self, request) -> tuple[str, str]:
        topic, channel = request.topic_channel()
        existing_channel(self.broker, topic, channel)
        return topic, channel

    # -- configuration and figures ---------------------------------------------------

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
        if level not in LEVELS:
            raise HttpError(400, "INVALID_VALUE")
        set_level(level)
        level = {"warn": "warning"}.get(level, level)
        self.broker.options = dataclasses.replace(self.broker.options, log_level=level)

    def metrics(self, request):
        return self.shared.read("metrics", lambda: Typed(
            from_store(self.broker, lambda s: self.broker.metrics.render()), CONTENT_TYPE))

    def stats(self, request):
        """One read for all the pollers asking at once (shared.py), encoded once."""
        topic, channel = request.arg("topic"), request.arg("channel")
        include_clients = BOOLS.get(request.arg("include_clients") or "", True)
        as_json = request.arg("format") == "json"
        return self.shared.read(("stats", topic, channel, include_clients, as_json),
                                lambda: self._stats(topic, channel, include_clients, as_json))

    def _stats(self, topic: str | None, channel: str | None, include_clients: bool,
               as_json: bool) -> str | Typed:
        self.broker.flush_latency()
        data = from_store(self.broker, lambda s: stats.collect(s, topic, channel, self.broker.e2e))
        clients = self._clients() if include_clients else {}
        for t in data["topics"]:
            for c in t["channels"]:
                c["clients"] = clients.get((t["topic_name"], c["channel_name"]), [])
        health = self.health() or "OK"
        producers = [producer_stats(c) for c in list(self.broker.clients.values())
                     if c.pub_counts] if include_clients else []
        if not as_json:
            return stats.text(data, health, self.start_time, producers)
        return Typed(json_bytes({"version": NSQD_VERSION, "health": health,
                                 "start_time": self.start_time, "topics": data["topics"],
                                 "producers": producers}), JSON)

    def _clients(self) -> dict:
        """This broker's consumers, by (topic, channel), in nsqd's ClientStats shape."""
        out: dict = {}
        for client in self.broker.subscribed_clients():
            channel = client.channel
            assert channel is not None      # subscribed_clients() have one
            out.setdefault((channel.topic, channel.name), []).append(client_stats(client))
        return out


def _pausing(request) -> bool:
    """/pause or /unpause (nsqd tells them apart the same way)."""
    return not request.path.endswith("unpause")
