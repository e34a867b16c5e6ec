"""The broker process: a gevent TCP server speaking NSQ V2 on top of the Store.

It holds no queue state: only its live connections, their RDY credit and the ids
each has in flight. Everything else is in Redis, so brokers can run side by side
(SO_REUSEPORT) and one can die without losing a message.

In-flight messages of a connection that closes (EOF, client timeout, fatal
error, broker shutdown) are requeued at once, under the owner check, so they
are never delivered twice. If the broker process itself dies, a scanner requeues
them when its registration expires (workers/reaper.py).
"""

import itertools
import logging
import signal
import socket
import time
from typing import Any, cast

import gevent
from gevent.event import Event
from gevent.server import StreamServer

from relay import codec
from relay.broker import collector, transport
from relay.broker.auth import Authorizer
from relay.broker.channel import Channel, Deliveries
from relay.broker.client import CLOSING, INIT, SUBSCRIBED, Client, announcement
from relay.broker.http.lookupd import lookupd_server
from relay.broker.http.nsqd import nsqd_server
from relay.broker.metrics import Metrics
from relay.broker.prefork import listen_addresses
from relay.broker.publishing import Publishing
from relay.broker.settling import Settling, wait_all
from relay.broker.protocol.reader import Reader
from relay.broker.protocol.v2 import ProtocolV2
from relay.broker.registry import TTL_MS, Registry
from relay.broker.wakeups import WakeupListener
from relay.codec import NSQD_VERSION
from relay.deadlines import Deadlines
from relay.errors import StoreError
from relay.liveness import new_id
from relay.options import Options, redacted_url
from relay.sockio import MAX_ACCEPT, listen, raise_open_file_limit, reserve
from relay.store import Store, codes, connect_redis, replication
from relay.store.commit import GroupCommit
from relay.store.connection import UNREACHABLE, RedisClient, connect_when_ready
from relay.store.keys import split_part
from relay.store.latency import E2eLatency
from relay.store.layout import LOTS, PRIORITIES, establish
from relay.store.runner import Op

log = logging.getLogger("relay.broker")

EXPIRY_TICK = 0.1
# clients encoded for the registry between two chances for deliveries to run: with
# 5,000 busy consumers the whole list took 35 ms, which a PUB then waited for
ANNOUNCE_SLICE = 250
SHUTDOWN_GRACE = 5.0
DRAIN_GRACE = 5.0
# into a stop, how long connections that are not consumers may take to end by themselves:
# one accepted as the listeners closed gets its answer (prefork's rolling restart)
REQUEST_GRACE = 1.0
LEAVE_GRACE = 1.0       # at least this long to leave the registry, after the graces
FILES_RESERVED = 64     # for Redis connections, listeners and logs
LATENCY_FLUSH_INTERVAL = 1.0


class Broker:
    def __init__(self, options: Options, client: RedisClient | None = None,
                 layout: int | None = None):
        """`layout`: the data layout in force, as establish() read it (read if None)."""
        self.options = options
        self.id = new_id()
        self.redis = client or connect_redis(options)
        self.metrics = Metrics(self)
        self.deadlines = Deadlines()    # of clients' commands, heartbeats, Redis answers
        # builds every op, and runs the HTTP API's calls on the client's pool; the
        # partition counts it misses are read through the group commit (_lookup)
        self.store = Store(self.redis, topic_partitions=options.topic_partitions,
                           topic_retention_ms=options.retention_time, lookup=self._lookup)
        # the group commit sends on connections of its own, which nothing else may use
        # meanwhile; its lanes' Stores share what this one learns (a topic's channels:
        # a lane's learning them did not reach the ops built here, and each MPUB to a
        # topic was sent twice, stale and again)
        self.commit = GroupCommit(self.store.sibling(True, **replication(options)),
                                  options.commit_lanes,
                                  observe=self.metrics.redis_round_trip.observe,
                                  patience=options.redis_timeout / 1000,
                                  deadlines=self.deadlines)
        self.publishing = Publishing(self)
        self.settling = Settling(self)
        self.tls_context = transport.server_context(options)
        self.auth = Authorizer(options)
        self.protocol = ProtocolV2(self)
        self.channels: dict[tuple, Channel] = {}
        self.topics: dict[str, dict[str, Channel]] = {}   # the same channels, by topic
        self.deliveries: dict[str, Deliveries] = {}     # each topic's delivery loop
        self.clients: dict[int, Client] = {}
        self._announced: tuple[list[str], str] = ([], "[]")     # the entries, and their JSON
        self.connections = 0    # TCP connections being served, from accept to close
        self.holding: set[Client] = set()     # clients that may hold messages in flight
        self.wakeups = WakeupListener(self)
        self.http = nsqd_server(self)
        self.lookupd = lookupd_server(self)
        self.registry = Registry(self.redis, self.id,
                                 establish(self.redis) if layout is None else layout)
        self.e2e = E2eLatency(options.e2e_processing_latency_percentiles,
                              options.e2e_processing_latency_window_time)
        self.tcp_port = 0
        self._numbers = itertools.count(1)
        self._server: StreamServer | None = None
        self._greenlets: list[gevent.Greenlet] = []
        self._wakeups: list[gevent.Greenlet] = []
        self.max_clients = 0
        self._last_refusal_log = float("-inf")
        self._handing_over: set[str] = set()    # parts whose backlog goes over from here
        self.stopping = False
        self.unreleased = 0         # in-flight messages a stop could not requeue
        self.unreleased_error: str | None = None

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> tuple:
        """Listen and start the background loops; returns the TCP address bound."""
        self.max_clients = max(raise_open_file_limit() - FILES_RESERVED, 1)
        self._server = StreamServer(listen(self.options.tcp_address), self.handle)
        self._server.max_accept = MAX_ACCEPT
        self._server.start()
        collector.install()
        self._wakeups = [gevent.spawn(self.wakeups.run), gevent.spawn(self.wakeups.catch_up)]
        self._greenlets = [gevent.spawn(self._expire_loop), *self._wakeups,
                           gevent.spawn(collector.unfreeze_loop)]
        if self.e2e.enabled:
            self._greenlets.append(gevent.spawn(self._flush_latency_loop))
        address = self._server.socket.getsockname()[:2]
        self.tcp_port = address[1]
        http = self.http.start(self.options.http_address) if self.options.http_address \
            else ("-", 0)
        lookupd = self.lookupd.start(self.options.lookupd_http_address) \
            if self.options.lookupd_http_address else ("-", 0)
        https = self.http.start(self.options.https_address, self.tls_context) \
            if self.tls_context and self.options.https_address else ("-", 0)
        self._greenlets.append(gevent.spawn(self.registry.register, {
            "hostname": socket.gethostname(), "broadcast_address": self.options.broadcast_address,
            "remote_address": f"{self.options.broadcast_address}:{self.tcp_port}",
            "tcp_port": self.tcp_port, "http_port": http[1], "version": NSQD_VERSION},
            self.announced_clients))
        log.info("broker %s listening tcp=%s http=%s https=%s lookupd=%s redis=%s", self.id,
                 *map(_where, (address, http, https, lookupd)),
                 redacted_url(self.options.redis_url))
        return address

    def serve_forever(self, started=None, stop: Event | None = None) -> None:
        """Serve until SIGTERM or SIGINT (or `stop` is set, when given: its handlers are
        the caller's); the handlers come first, so a signal that arrives as soon as the
        port accepts still stops the broker cleanly. `started()` is called once it
        listens (relay/broker/prefork.py waits for it)."""
        if stop is None:
            stop = stop_on_signals()
        address = self.start()
        if started:
            started()
        stop.wait()
        log.info("broker %s stopping (tcp=%s:%s)", self.id, *address)
        self.stop()

    def stop(self) -> None:
        """Stop accepting, let consumers finish what they hold, then close every client
        (what is still in flight is requeued at once) and leave the registry, within
        DRAIN_GRACE + SHUTDOWN_GRACE (and a moment) even while Redis is unreachable:
        then one line says what is left for the registration's expiry."""
        began = time.monotonic()
        deadline = began + DRAIN_GRACE + SHUTDOWN_GRACE
        self.stopping = True
        self.registry.quiet = self.commit.quiet = True
        gevent.killall(self._wakeups)   # nothing more is delivered: no news needed
        cast(StreamServer, self._server).close()     # started
        self.http.stop()
        self.lookupd.stop()
        self._drain(DRAIN_GRACE)
        self._let_requests_end(began + REQUEST_GRACE)
        for client in list(self.clients.values()):
            client.close()
        while self.clients and time.monotonic() < deadline:
            gevent.sleep(0.02)
        gevent.killall(self._greenlets)
        error = self._leave(max(deadline - time.monotonic(), LEAVE_GRACE))
        self.commit.stop()
        if error is not None:
            self._left_behind(error)
        elif self.unreleased:
            log.warning("could not requeue the %d messages its clients held in flight (%s): "
                        "a scanner reaps them now that broker %s left", self.unreleased,
                        self.unreleased_error, self.id)

    def _leave(self, grace: float) -> str | None:
        """Record the last FIN latencies and leave the registry, within `grace` seconds;
        None once done, else why not."""
        try:
            with gevent.Timeout(grace):
                self.e2e.flush(self.store)
                self.registry.leave()
            return None
        except gevent.Timeout:
            return f"no answer within {grace:.1f} s"
        except UNREACHABLE + (StoreError,) as e:
            return str(e)

    def _left_behind(self, error: str) -> None:
        """The one line of a stop that could not leave the registry: what happens to what
        the broker leaves behind, and when."""
        n = self.unreleased
        held = (f", requeueing the {n} message{'s' if n > 1 else ''} its clients held in "
                "flight" if n else "")
        log.warning("redis unreachable while stopping (%s): the registration of broker %s "
                    "expires by itself within %d s, then a scanner reaps what it left%s",
                    error, self.id, TTL_MS // 1000, held)

    def _drain(self, grace: float) -> None:
        """A CLS for every consumer: no more deliveries, and CLOSE_WAIT, on which go-nsq
        closes once its in-flight messages are done. FIN/REQ still work meanwhile; a
        consumer is closed as soon as it holds nothing, the rest after `grace`."""
        for client in list(self.clients.values()):
            if client.state == SUBSCRIBED:
                client.start_close()
                client.respond(codec.CLOSE_WAIT)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            holding = False
            for client in list(self.clients.values()):
                if client.in_flight:
                    holding = True
                elif client.state == CLOSING:
                    client.close()
            if not holding:
                return
            gevent.sleep(0.02)

    def _let_requests_end(self, deadline: float) -> None:
        """Until `deadline`, let the connections that are not consumers end by themselves:
        producers, and those accepted just before the listeners closed (not yet past the
        protocol magic), whose request is answered rather than cut."""
        while time.monotonic() < deadline and self.connections > sum(
                1 for client in self.clients.values() if client.state != INIT):
            gevent.sleep(0.02)

    # -- connections ----------------------------------------------------------

    def handle(self, sock: socket.socket, address) -> None:
        self.connections += 1
        try:
            self._handle(sock, address)
        finally:
            self.connections -= 1

    def _handle(self, sock: socket.socket, address) -> None:
        if len(self.clients) >= self.max_clients:
            self._refuse(sock, address)
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            magic = self._magic(sock)
        except OSError:
            sock.close()
            return
        if magic != codec.MAGIC_V2:
            if len(magic) == 4:
                try:
                    sock.sendall(codec.frame(codec.FRAME_ERROR, b"E_BAD_PROTOCOL"))
                except OSError:
                    pass
            sock.close()
            return
        client = Client(next(self._numbers), sock, address, self.id, self.options,
                        self.deadlines)
        self.clients[client.number] = client
        log.debug("%r connected", client)
        writer = gevent.spawn(self.protocol.write_replies, client)
        pump = gevent.spawn(client.pump)
        try:
            self.protocol.io_loop(client, Reader(client, self.deadlines))
        finally:
            client.replies.put(None)
            writer.join()
            client.close()
            pump.kill()
            self._disconnect(client)
            del self.clients[client.number]
            if client.channel is not None:
                self.registry.clients_changed()  # announced once it is off the list
            log.debug("%r disconnected", client)

    def _magic(self, sock: socket.socket) -> bytes:
        """The 4-byte protocol magic, however the client splits it, within the client
        timeout (gevent's recv does not wait for MSG_WAITALL); fewer bytes at EOF."""
        magic = b""
        deadline = time.monotonic() + self.options.client_timeout / 1000
        while len(magic) < 4:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("no protocol magic within the client timeout")
            sock.settimeout(remaining)
            chunk = sock.recv(4 - len(magic))
            if not chunk:
                break
            magic += chunk
        return magic

    def _refuse(self, sock: socket.socket, address) -> None:
        """Close a connection past the open-file limit at once, rather than letting
        accept() fail with EMFILE for everyone (Redis connections included)."""
        sock.close()
        now = time.monotonic()
        if now - self._last_refusal_log > 10:
            self._last_refusal_log = now
            log.warning("refusing connections (e.g. from %s:%s): %d clients, the open-file "
                        "limit allows %d", *address[:2], len(self.clients), self.max_clients)

    def subscribe(self, client: Client, topic: str, channel_name: str) -> None:
        """SUB: register the consumer in Redis, in every part of the topic, then join the
        local delivery loop. A local channel of an incarnation since deleted closes its
        consumers first."""
        channel = self.channels.get((topic, channel_name))
        if channel is not None:
            self.grow(channel)
        parts = self.store.parts(topic)
        joined = self._join(parts, channel_name, client.number)
        channel = self.channels.get((topic, channel_name))  # the calls let others run
        if channel is None:
            if topic not in self.deliveries:
                self.deliveries[topic] = Deliveries(self, topic)
            channel = self.deliveries[topic].channel(channel_name, parts, joined)
            self.channels[(topic, channel_name)] = channel
            self.topics.setdefault(topic, {})[channel_name] = channel
            for part in channel.parts:
                self.wakeups.watch(part.name)
        elif channel.incarnations != [j.incarnation for j in joined[:len(channel.parts)]]:
            channel.deleted()
            channel.rejoined(parts, joined)
        else:
            for index, part_joined in enumerate(joined[:len(channel.parts)]):
                channel.emptied(part_joined.empties, index)
        client.incarnation = [j.incarnation for j in joined]
        client.state = SUBSCRIBED
        channel.add(client)
        self.registry.clients_changed()

    def _join(self, parts: list[str], channel_name: str, order: int) -> list:
        """subscribe.lua in each part, for one consumer: the Subscribed of each."""
        calls = [self.commit.submit(self.store.subscribe_op(part, channel_name, self.id), order)
                 for part in parts]
        joined = [call.get() for call in calls]
        self.store.learn_channel_count(split_part(parts[0])[0], joined[0].channels)
        for part, part_joined in zip(parts, joined):
            if part_joined.hand_over and part not in self._handing_over:
                self._handing_over.add(part)
                gevent.spawn(self._hand_over, part)
        return joined

    def _hand_over(self, part: str) -> None:
        """The steps of a backlog going to the topic's first channel (subscribe.lua), or
        of an unpause whose runner died, from here, beside the clients: the consumers
        get what each step moves."""
        try:
            self.store.hand_over(part)
        except StoreError as e:
            log.warning("%s: the backlog's steps stopped (%s); the next SUB or an unpause "
                        "goes on with them", part, e)
        finally:
            self._handing_over.discard(part)

    def grow(self, channel: Channel) -> None:
        """The channel's topic has more partitions than it has parts: its consumers join
        the new parts, and the channel delivers from them."""
        parts = self.store.parts(channel.topic)
        new = parts[len(channel.parts):]
        if not new or not channel.clients:
            return
        for client in list(channel.clients):
            joined = self._join(new, channel.name, client.number)
            client.incarnation = client.incarnation + [j.incarnation for j in joined]
        channel.grow(new, joined)
        for part in new:
            self.wakeups.watch(part)
        log.info("%s/%s: %d partitions now", channel.topic, channel.name, len(parts))

    @property
    def lots(self) -> bool:
        """Whether deliveries go in flight as lots: data layout 4 is in force (read
        again with each heartbeat, relay/store/layout.py)."""
        presence = self.registry.presence
        return presence is not None and presence.layout >= LOTS

    @property
    def prioritized(self) -> bool:
        """Whether messages may have priorities: data layout 5 is in force."""
        presence = self.registry.presence
        return presence is not None and presence.layout >= PRIORITIES

    def subscribed_clients(self) -> list[Client]:
        return [c for c in self.clients.values()
                if c.state == SUBSCRIBED and c.channel is not None]

    def _lookup(self, op: Op) -> Any:
        """A partition count this broker's Store missed, read through the group commit:
        a burst of SUBs and PUBs to new topics is one pipeline."""
        return self.commit.call(op)

    def announced_clients(self) -> str:
        """What the registry announces, as one JSON list (client.announcement), encoded in
        slices with the other greenlets let run in between. Joined again only when an
        entry changed: at 5,000 idle consumers joining 1.5 MB every 5 s was 8% of
        the broker's CPU, and the registry compares the same string at once."""
        entries = []
        for n, client in enumerate(self.subscribed_clients(), 1):
            if n % ANNOUNCE_SLICE == 0:
                gevent.sleep(0)
            if client.channel is not None:      # it may have left meanwhile
                entries.append(announcement(client))
        if entries != self._announced[0]:
            self._announced = (entries, "[" + ", ".join(entries) + "]")
        return self._announced[1]

    def _disconnect(self, client: Client) -> None:
        """Give back what the client held in flight and leave its channel."""
        channel = client.channel
        if channel is None:
            return
        held = client.release()
        self.holding.discard(client)
        channel.remove(client)
        if not channel.clients:
            channel.stop()
            del self.channels[(channel.topic, channel.name)]
            local = self.topics[channel.topic]
            del local[channel.name]
            if not local:
                del self.topics[channel.topic]
                self.deliveries.pop(channel.topic).stop()
                for part in channel.parts:
                    self.wakeups.unwatch(part.name)
        store = self.store
        try:
            wait_all(self.settling.requeue(channel, client.owner, [(i, 0) for i in held],
                                           client.number))
            leaving = [self.commit.submit(store.unsubscribe_op(
                part.name, channel.name, self.id, codec.is_ephemeral(channel.name),
                codec.is_ephemeral(channel.topic), incarnation), client.number)
                for part, incarnation in zip(channel.parts, client.incarnation)]
            if [call.get() for call in leaving][:1] == [codes.TOPIC_DELETED]:
                store.control.forget_topic(channel.topic)
        except StoreError as e:
            if self.stopping:      # one line at the end of the stop (_left_behind)
                self.unreleased += len(held)
                self.unreleased_error = self.unreleased_error or str(e)
                return
            log.warning("%r: could not release %d in-flight messages (%s); "
                        "they are redelivered after their timeout", client, len(held), e)

    def _expire_loop(self) -> None:
        """Free RDY credit of messages whose deadline passed (a scanner requeues them).
        Only the clients that were given messages are walked, so idle consumers cost
        nothing here."""
        while True:
            gevent.sleep(EXPIRY_TICK)
            now = time.monotonic()
            for client in list(self.holding):
                if not client.in_flight:
                    self.holding.discard(client)
                else:
                    client.expire(now)

    def flush_latency(self) -> None:
        """Hand this broker's FIN latencies to Redis, where /stats of any broker reads them."""
        try:
            self.e2e.flush(self.store)
        except StoreError as e:
            log.warning("could not record e2e latencies (%s)", e)

    def _flush_latency_loop(self) -> None:
        while True:
            gevent.sleep(LATENCY_FLUSH_INTERVAL)
            self.flush_latency()


def serve(options: Options, started=None) -> None:
    """`relay broker`: wait for Redis (no deadline: a Procfile starts everything at once),
    then serve until SIGTERM or SIGINT, which also end the wait."""
    stop = stop_on_signals()
    _check_before_waiting(options)
    ready = connect_when_ready(options, stop.is_set, log, stop.wait, first=establish)
    if ready is None:
        log.info("broker stopped before redis at %s was ready: it served nothing and "
                 "registered nowhere", redacted_url(options.redis_url))
        return
    Broker(options, *ready).serve_forever(started, stop)


def _check_before_waiting(options: Options) -> None:
    """What stops a broker whatever Redis does, found before waiting for it: TLS and auth
    files that cannot be used (ConfigError), a port another program holds (OSError)."""
    check_files(options)
    for address in listen_addresses(options).values():
        reserve(address).close()


def check_files(options: Options) -> None:
    """Raise ConfigError if the TLS or auth files cannot be used."""
    transport.server_context(options)
    Authorizer(options)


def stop_on_signals() -> Event:
    """An Event that SIGTERM and SIGINT set."""
    stop = Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(sig, stop.set)
    return stop


def _where(address: tuple) -> str:
    """host:port of a listener, "-" for one that is off (port 0)."""
    return f"{address[0]}:{address[1]}" if address[1] else "-"

