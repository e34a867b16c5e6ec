"""One TCP client's state on this broker (nsqd clientV2)."""

import json
import os
import random
import socket
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import gevent
from gevent.event import Event
from gevent.lock import Semaphore
from gevent.queue import Queue

from relay import codec
from relay.broker import transport
from relay.deadlines import Deadlines
from relay.store import inflight

if TYPE_CHECKING:
    import ssl

    from relay.broker.auth import Grant
    from relay.broker.channel import Channel
    from relay.broker.protocol.replies import Reply
    from relay.errors import ClientError
    from relay.options import Options

INIT, SUBSCRIBED, CLOSING = "init", "subscribed", "closing"
DEFAULT_OUTPUT_BUFFER_SIZE = 16 * 1024
MAX_PENDING_REPLIES = 1024
# IDENTIFY's client_id, hostname and user_agent are kept to this many characters (nsqd
# keeps them whole, but it does not write them to a shared registry): 20 clients with a
# 5 MB user_agent each made a 105 MB registry key and slowed every broker's reads of it
MAX_NAME_LENGTH = 256
# Bytes of delivered messages not yet written to a consumer's socket before it gets
# no more: a consumer that stops reading costs this much memory (plus one message),
# not RDY x msg size, as each delivery is bounded by what is left of it.
# One that stays stuck longer than --client-timeout is closed by the socket timeout.
MAX_UNSENT_BYTES = 4 * 1024 * 1024
LATE_ITEMS = 10_000


class Client:
    """Settings from IDENTIFY, RDY credit, and the ids this connection holds in flight.
    Its methods are the only writers of the credit (ready_count, in_flight), as nsqd's
    clientV2; each change that frees credit tells the channel.

    `in_flight` maps id -> (local deadline in monotonic seconds, publish time in ns,
    delivery in monotonic seconds, item), oldest first, so the broker can free RDY credit
    when a message times out without asking Redis, time publish-to-FIN, and cap a TOUCH
    (Redis keeps no delivery time). The item is how its FIN, REQ and TOUCH name it to
    Redis: its id, or its lot item if it went in flight in a lot (relay/store/inflight.py);
    those of the last LATE_ITEMS lot items timed out here stay known, for a FIN that comes
    late.
    """

    def __init__(self, number: int, sock: socket.socket, address: tuple, broker_id: str,
                 options: "Options", deadlines: Deadlines) -> None:
        self.number = number
        self.deadlines = deadlines
        self.owner = f"{broker_id}:{number}"
        self.sock = sock
        self.transport: transport.Transport = transport.Plain(sock)
        self.tls = self.snappy = self.deflate = False
        self.tls_common_name = ""
        self.tls_details = transport.NO_TLS
        self.secret = ""
        self.grant: Grant | None = None       # once AUTH succeeded
        self.remote_address = f"{address[0]}:{address[1]}"
        self.state = INIT
        self.client_id = self.hostname = str(address[0])
        self.user_agent = ""
        self.heartbeat_interval = options.heartbeat_interval
        # monotonic time the first heartbeat was written since the command being read
        # began (Reader.begin_command), None if none was: the read deadline counts from it
        self.unanswered_beat: float | None = None
        self.msg_timeout = options.msg_timeout
        self.sample_rate = 0
        self.dedup = False      # IDENTIFY relay_dedup: its publishes may carry keys
        self.order = False      # IDENTIFY relay_order: its publishes may carry order keys
        self.output_buffer_size = DEFAULT_OUTPUT_BUFFER_SIZE
        self.output_buffer_timeout = options.output_buffer_timeout
        self.ready_count = 0
        self.in_flight: OrderedDict[bytes, tuple] = OrderedDict()
        self._late_items: OrderedDict[bytes, bytes] = OrderedDict()
        self.channel: "Channel | None" = None
        self.incarnation: list[int] = []    # of the channel it joined, per part (subscribe.lua)
        self.message_count = self.finish_count = self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}     # topic -> messages published
        self.announced: tuple | None = None     # (figures, JSON) as stats.announcement made it
        self.connect_ts = int(time.time())
        self.closed = False
        # to the writer: replies and errors in command order, None once the reader is done
        self.replies: Queue[Reply | ClientError] = Queue(MAX_PENDING_REPLIES)
        self.writing = False    # the writer greenlet is sending a reply
        # set while no reply is being answered from the hub (ProtocolV2._answer_later):
        # the replies after it wait for it
        self.answered = Event()
        self.answered.set()
        self._outbox: list[bytes] = []
        self._unsent = 0
        self._outbox_ready = Event()
        self._write_lock = Semaphore()

    def __repr__(self) -> str:
        return f"Client({self.owner} {self.remote_address})"

    # -- IDENTIFY --------------------------------------------------------------

    def identify(self, data: dict, options: "Options") -> str | None:
        """Apply IDENTIFY settings; the first invalid one is returned as nsqd words it."""
        self.client_id = data.get("client_id", self.client_id)[:MAX_NAME_LENGTH]
        self.hostname = data.get("hostname", self.hostname)[:MAX_NAME_LENGTH]
        self.user_agent = data.get("user_agent", self.user_agent)[:MAX_NAME_LENGTH]

        hb = data.get("heartbeat_interval", 0)
        if hb == -1:
            self.heartbeat_interval = 0
        elif hb != 0:
            if not 1000 <= hb <= options.max_heartbeat_interval:
                return f"heartbeat interval ({hb}) is invalid"
            self.heartbeat_interval = hb

        timeout = data.get("output_buffer_timeout", 0)
        if timeout == -1:
            self.output_buffer_timeout = 0
        elif timeout != 0:
            if not (options.min_output_buffer_timeout <= timeout
                    <= options.max_output_buffer_timeout):
                return f"output buffer timeout ({timeout}) is invalid"
            self.output_buffer_timeout = timeout

        size = data.get("output_buffer_size", 0)
        if size == -1:
            self.output_buffer_size, self.output_buffer_timeout = 1, 0
        elif size != 0:
            if not 64 <= size <= options.max_output_buffer_size:
                return f"output buffer size ({size}) is invalid"
            self.output_buffer_size = size

        self.dedup = data.get("relay_dedup", self.dedup)
        self.order = data.get("relay_order", self.order)
        rate = data.get("sample_rate", 0)
        if not 0 <= rate <= 99:
            return f"sample rate ({rate}) is invalid"
        self.sample_rate = rate

        msg_timeout = data.get("msg_timeout", 0)
        if msg_timeout != 0:
            if not 1000 <= msg_timeout <= options.max_msg_timeout:
                return f"msg timeout ({msg_timeout}) is invalid"
            self.msg_timeout = msg_timeout
        return None

    # -- delivery ----------------------------------------------------------------

    def credit(self) -> int:
        """How many more messages may go to this client now (RDY caps in-flight)."""
        if self.state != SUBSCRIBED or self.closed or self._unsent >= MAX_UNSENT_BYTES:
            return 0
        return max(0, self.ready_count - len(self.in_flight))

    def unsent_room(self) -> int:
        """The bytes of messages this client may still be given before it has written
        what it holds (its next delivery is bounded by this in Redis, deliver.lua)."""
        return max(0, MAX_UNSENT_BYTES - self._unsent)

    def accept(self, records: list, lot: bytes = b"") -> tuple[list, list]:
        """Take delivered records (`lot`: the lot they went in flight as, Delivered.lot):
        returns (items to give back, items sampled out to finish)."""
        ids = [codec.record_id(r) for r in records]
        items = inflight.items(ids, lot)
        if self.state != SUBSCRIBED or self.closed:
            return items, []
        now = time.monotonic()
        deadline = now + self.msg_timeout / 1000
        sampled_out, frames = [], []
        for r, msg_id, item in zip(records, ids, items):
            if self.sample_rate and random.randint(1, 100) > self.sample_rate:
                sampled_out.append(item)
                continue
            self.in_flight[msg_id] = (deadline, codec.record_timestamp(r), now, item)
            frames.append(r)
        if frames:
            self.message_count += len(frames)
            data = codec.message_frames(frames)
            self._unsent += len(data)
            self._outbox.append(data)
            if not self._written_now():
                self._outbox_ready.set()
        return [], sampled_out

    def _written_now(self) -> bool:
        """Write the outbox from here (the delivering greenlet), if it is all that waits
        to go, the pump would not buffer it (_buffer), nothing else is writing, and the
        socket takes it at once: then the pump is not woken, a hop per delivery saved.
        A plain socket only (TLS and compression write through their layers); whatever
        the socket does not take goes by the pump. Never waits: one consumer's full
        socket must not hold up the others' deliveries."""
        if (len(self._outbox) != 1 or self._write_lock.locked() or self.tls
                or type(self.transport) is not transport.Plain
                or (self.output_buffer_timeout and self.credit() > 0)):
            return False
        data = self._outbox[0]
        try:
            sent = os.write(self.sock.fileno(), data)
        except OSError:     # full (BlockingIOError), or gone: the pump sees to it
            return False
        self._sent(sent)
        if sent < len(data):
            self._outbox[0] = data[sent:]
            return False
        self._outbox.clear()
        return True

    def send_now(self, data: bytes) -> bool:
        """Write whole frames without waiting, from the hub too: False, having written
        nothing, unless the socket is plain and no one else is writing. What the socket
        does not take at once is sent by a greenlet of its own, the frames kept whole."""
        if (self.tls or type(self.transport) is not transport.Plain
                or not self._write_lock.acquire(blocking=False)):
            return False
        try:
            sent = os.write(self.sock.fileno(), data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._write_lock.release()
            self.close()
            return True
        if sent == len(data):
            self._write_lock.release()
        else:
            gevent.spawn(self._send_rest, data[sent:])
        return True

    def _send_rest(self, data: bytes) -> None:
        """The rest of a send_now, under the write lock it took."""
        try:
            self._send_held(data)
        except OSError:
            self.close()
        finally:
            self._write_lock.release()

    def set_ready(self, count: int) -> None:
        """RDY (nsqd SetReadyCount)."""
        self.ready_count = count
        self._credit_changed()

    def start_close(self) -> None:
        """CLS, or the broker draining (nsqd StartClose): no more deliveries."""
        self.state = CLOSING
        self.ready_count = 0

    def item(self, msg_id: bytes) -> bytes:
        """How a TOUCH names msg_id to Redis: its item, or the id."""
        entry = self.in_flight.get(msg_id)
        return entry[3] if entry is not None else self._late_items.get(msg_id, msg_id)

    def settled(self, ids: list[bytes]) -> tuple[dict[bytes, int], list[bytes]]:
        """FIN or REQ of ids (nsqd FinishedMessage / RequeuedMessage): those it held stop
        counting against RDY; returns them with their publish times (ns), and the items
        that name `ids` to Redis."""
        held, items, late = {}, [], self._late_items
        for msg_id in ids:
            entry = self.in_flight.pop(msg_id, None)
            if entry is not None:
                held[msg_id] = entry[1]
                items.append(entry[3])
            else:
                items.append(late.get(msg_id, msg_id) if late else msg_id)
        if held:
            self._credit_changed()
        return held, items

    def release(self) -> list[bytes]:
        """Everything held in flight, given up as the connection closes, as items."""
        held = [entry[3] for entry in self.in_flight.values()]
        self.in_flight.clear()
        return held

    def forget(self, ids: list[bytes] | None = None) -> None:
        """The channel (or the part of it that held `ids`) was emptied: what was held
        there is gone (the channel looks again for what it may deliver)."""
        if ids is None:
            self.in_flight.clear()
        else:
            for msg_id in ids:
                self.in_flight.pop(msg_id, None)

    def expire(self, now: float) -> int:
        """Forget in-flight ids past their deadline (the scanner requeues them); their
        credit is free again."""
        n = 0
        while self.in_flight:
            msg_id, (deadline, _, _, item) = next(iter(self.in_flight.items()))
            if deadline > now:
                break
            del self.in_flight[msg_id]
            if item is not msg_id:
                self._late_items[msg_id] = item
                if len(self._late_items) > LATE_ITEMS:
                    self._late_items.popitem(last=False)
            n += 1
        if n:
            self._credit_changed()
        return n

    def _credit_changed(self) -> None:
        if self.channel is not None:
            self.channel.credit_changed()

    def touch_timeout(self, msg_id: bytes, max_msg_timeout_ms: int) -> int:
        """The timeout (ms from now) a TOUCH of msg_id sets: msg_timeout, but never past
        max_msg_timeout after its delivery (nsqd TouchMessage); 0 for an id this
        connection no longer holds (it timed out: the scanner requeues it)."""
        entry = self.in_flight.get(msg_id)
        if entry is None:
            return 0
        left = max_msg_timeout_ms - (time.monotonic() - entry[2]) * 1000
        return max(0, min(self.msg_timeout, int(left)))

    def touched(self, msg_id: bytes, timeout_ms: int) -> None:
        if msg_id in self.in_flight:
            _, published_ns, delivered, item = self.in_flight[msg_id]
            self.in_flight[msg_id] = (time.monotonic() + timeout_ms / 1000, published_ns,
                                      delivered, item)
            self.in_flight.move_to_end(msg_id)

    # -- writing -------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Write whole frames; one writer at a time so frames never interleave. A write
        the client does not take within two heartbeats fails (socket.timeout): the reader
        keeps its deadline apart (Reader._recv), so the socket's timeout is the writes'."""
        with self._write_lock:
            self._send_held(data)

    def _send_held(self, data: bytes) -> None:
        """send's write, the write lock held."""
        hb = self.heartbeat_interval
        self.sock.settimeout(2 * hb / 1000 if hb > 0 else None)
        self.transport.send(data)

    # -- upgrades negotiated by IDENTIFY ---------------------------------------------

    def upgrade_tls(self, context: "ssl.SSLContext") -> None:
        """The server side of the TLS handshake, on the socket as it is."""
        sock = context.wrap_socket(self.sock, server_side=True, do_handshake_on_connect=False)
        self.sock = sock
        sock.do_handshake()
        self.transport = transport.Plain(sock)
        self.tls = True
        self.tls_common_name = transport.common_name(sock)
        self.tls_details = transport.details(sock)

    def upgrade_snappy(self) -> None:
        self.transport = transport.Snappy(self.transport)
        self.snappy = True

    def upgrade_deflate(self, level: int, max_inflated: int) -> None:
        self.transport = transport.Deflate(self.transport, level, max_inflated)
        self.deflate = True

    def respond(self, data: bytes) -> None:
        """A response frame the client did not ask for (CLOSE_WAIT at shutdown)."""
        try:
            self.send(codec.frame(codec.FRAME_RESPONSE, data))
        except OSError:
            self.close()

    def pump(self) -> None:
        """Write delivered messages, and a heartbeat each interval (nsqd messagePump)."""
        try:
            while not self.closed:
                if not self._woken():
                    self.send(codec.frame(codec.FRAME_RESPONSE, codec.HEARTBEAT))
                    if self.unanswered_beat is None:
                        self.unanswered_beat = time.monotonic()
                    continue
                self._outbox_ready.clear()
                self._buffer()
                data, self._outbox = b"".join(self._outbox), []
                if data:
                    self.send(data)
                    self._sent(len(data))
        except OSError:
            self.close()  # the peer is gone; what it held in flight is requeued

    def _woken(self) -> bool:
        """Waits for the outbox to be woken (True), or a heartbeat interval (False: a
        heartbeat is due). The broker's Deadlines keep the interval, for a gevent
        Timeout per wait cost more than the wait; the beat leaves the outbox woken, so
        the next call returns at once, and a wake at the same time is not lost."""
        if self.heartbeat_interval <= 0:
            self._outbox_ready.wait()
            return True
        beat = Beat(time.monotonic() + self.heartbeat_interval / 1000, self._outbox_ready)
        self.deadlines.watch(beat)
        try:
            self._outbox_ready.wait()
        finally:
            self.deadlines.unwatch(beat)
        return not beat.due or bool(self._outbox) or self.closed

    def _buffer(self) -> None:
        """nsqd's output buffering: while the client can take more messages, wait up to
        output_buffer_timeout for output_buffer_size bytes before writing, so a busy
        consumer gets fewer, larger writes; one that cannot take more gets them now."""
        if not self.output_buffer_timeout or not self._outbox:
            return
        deadline = time.monotonic() + self.output_buffer_timeout / 1000
        while (self._unsent < self.output_buffer_size and self.credit() > 0
               and not self.closed):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._outbox_ready.wait(remaining):
                return
            self._outbox_ready.clear()

    def _sent(self, n: int) -> None:
        """Written to the socket: a client held back by MAX_UNSENT_BYTES may take more."""
        held_back = self._unsent >= MAX_UNSENT_BYTES
        self._unsent -= n
        if held_back and self._unsent < MAX_UNSENT_BYTES:
            self._credit_changed()

    def heartbeat_changed(self) -> None:
        """Let the pump pick up a new heartbeat interval now."""
        self._outbox_ready.set()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._outbox_ready.set()
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            gevent.spawn_later(0, self.sock.close)


class Beat:
    """A heartbeat interval of a client's pump (Client._woken), kept by Deadlines."""

    __slots__ = ("expires", "outbox_ready", "due")

    def __init__(self, expires: float, outbox_ready: Event) -> None:
        self.expires = expires
        self.outbox_ready = outbox_ready
        self.due = False

    def expire(self) -> None:
        self.due = True
        self.outbox_ready.set()


def client_stats(client: Client) -> dict:
    """nsqd's ClientStats of a subscribed connection: in /stats, and announced to the
    broker registry for relay-admin."""
    return {"client_id": client.client_id, "hostname": client.hostname, "version": "V2",
            "remote_address": client.remote_address, "state": 3,
            "ready_count": client.ready_count, "in_flight_count": len(client.in_flight),
            "message_count": client.message_count, "finish_count": client.finish_count,
            "requeue_count": client.requeue_count, "connect_ts": client.connect_ts,
            "sample_rate": client.sample_rate, "deflate": client.deflate,
            "snappy": client.snappy, "user_agent": client.user_agent, "tls": client.tls,
            **client.tls_details}


def announcement(client: Client) -> str:
    """A subscribed client's entry in its broker's registration (relay/broker/registry.py), as
    JSON: its stats, channel and owner id (as in-flight leases name it). Encoded again
    only when a figure that can change after SUB did: encoding 10,000 idle consumers at
    every heartbeat took 75 ms, and its garbage made the collector walk every object."""
    figures = (client.ready_count, len(client.in_flight), client.message_count,
               client.finish_count, client.requeue_count)
    if client.announced is None or client.announced[0] != figures:
        assert client.channel is not None   # subscribed
        client.announced = (figures, json.dumps({
            "topic": client.channel.topic, "channel": client.channel.name,
            "owner": client.owner, **client_stats(client)}))
    return client.announced[1]


def producer_stats(client: Client) -> dict:
    """nsqd's ClientStats of a connection that published, with its pub_counts."""
    return {**client_stats(client), "state": 0,
            "pub_counts": [{"topic": t, "count": n} for t, n in client.pub_counts.items()]}
