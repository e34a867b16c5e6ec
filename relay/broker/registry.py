"""The broker registry: each broker announces itself in Redis with a TTL heartbeat
(relay/liveness.py), so any broker can answer nsqlookupd's questions (/lookup, /nodes)
for all of them, and `relay-admin` can show every broker's clients.

Each heartbeat also registers the broker as a process of its release and reads the
data layout in force (relay/store/layout.py): a broker that cannot read it stops.

A broker killed with -9 drops out when its registration expires (3 heartbeats), and
its clients with it; a scanner then reaps what it left in the channels (workers/reaper.py). The clients are announced at each heartbeat and soon after one
subscribes or leaves, so their counters are up to a heartbeat old. Announcing goes on
at Redis' maxmemory (relay/store/bookkeeping.py).

A broker tombstoned for a topic (nsqlookupd's /topic/tombstone) is named by its HTTP
address in the topic's tombstones hash, with the time its tombstone ends; a topic or
channel nsqlookupd's /topic/delete or /channel/delete forgot is named likewise in the
topic's deregistered hash. Every broker reads them; each hash expires with its last
entry.
"""

import json
import logging
import time
from typing import Callable

import gevent
import redis
from gevent.event import Event

from relay.liveness import Liveness
from relay.store import bookkeeping, keys
from relay.store.causes import cause
from relay.store.connection import UNREACHABLE, RedisClient
from relay.store.keys import TopicKeys
from relay.store.layout import Presence, stop_now

log = logging.getLogger("relay.registry")

HEARTBEAT = 5.0
TTL_MS = 15_000
MIN_INTERVAL = 0.5


class Registry:
    def __init__(self, client: RedisClient, broker_id: str, layout: int | None = None):
        """`layout`: the data layout in force when the broker started; given, the
        broker also registers as a process of its release (relay/store/layout.py)."""
        self.redis = client
        self.id = broker_id
        self.presence = None if layout is None else Presence(client, "broker", broker_id, layout)
        self.brokers = broker_liveness(client)
        self.info: dict = {}
        self.clients: Callable[[], str] = lambda: "[]"
        self._announced: str | None = None      # the clients' JSON last written
        self.quiet = False      # a stopping broker's: its stop says what failed, once
        self._changed = Event()

    def register(self, info: dict, clients: Callable[[], str] = lambda: "[]") -> None:
        """Announce now, then every HEARTBEAT seconds or sooner when the clients
        changed, at most every MIN_INTERVAL (call in a greenlet). `clients` returns
        them as one JSON list. A failure is said once, until an announce works again."""
        self.info, self.clients = info, clients
        failing = False
        while True:
            try:
                self.announce()
                if failing and not self.quiet:
                    log.info("broker %s announced again", self.id)
                failing = False
            except UNREACHABLE + (redis.exceptions.RedisError,) as e:  # tried again
                if not failing and not self.quiet:
                    log.warning("could not announce broker %s: %s", self.id, cause(e))
                failing = True
            gevent.sleep(MIN_INTERVAL)
            self._changed.wait(HEARTBEAT - MIN_INTERVAL)
            self._changed.clear()

    def clients_changed(self) -> None:
        self._changed.set()

    def announce(self) -> None:
        """Register again; the clients are written only when they changed (otherwise
        their TTL is renewed), as a broker of 10,000 idle consumers announces 4 MB."""
        key, clients_key = keys.broker_key(self.id), keys.broker_clients_key(self.id)
        clients = self.clients()
        unchanged = clients == self._announced
        write_clients = ("SET", clients_key, clients, "PX", TTL_MS)
        info = [item for pair in self.info.items() for item in pair]
        replies = bookkeeping.write(
            self.redis, ("PEXPIRE", clients_key, TTL_MS) if unchanged else write_clients,
            *([("HSET", key, *info)] if info else []), ("PEXPIRE", key, TTL_MS),
            self.brokers.heartbeat_write(self.id),
            *(self.presence.writes() if self.presence else []))
        refused = self.presence.refused(replies[-1]) if self.presence else None
        if refused:
            stop_now(refused)
        if unchanged and not replies[0]:  # the key was gone (expired, or Redis restarted)
            bookkeeping.write(self.redis, write_clients)
        self._announced = clients

    def leave(self) -> None:
        """Deregister now; raises what the client raises (Broker.stop says it in one line:
        the registration expires by itself anyway)."""
        pipe = self.redis.pipeline(transaction=False)
        self.brokers.leave(self.id, pipe)
        pipe.delete(keys.broker_key(self.id))  # one key each: they may be on two nodes
        pipe.delete(keys.broker_clients_key(self.id))
        if self.presence:
            self.presence.leave(pipe)
        pipe.execute()


def broker_liveness(client: RedisClient) -> Liveness:
    return Liveness(client, keys.BROKERS, TTL_MS)


def live_brokers(client: RedisClient) -> list[dict]:
    """Registrations that have not expired, oldest id first; expired ones are dropped."""
    ids = broker_liveness(client).live()
    pipe = client.pipeline(transaction=False)
    for broker_id in ids:
        pipe.hgetall(keys.broker_key(broker_id))
    out = []
    for broker_id, info in zip(ids, pipe.execute()):
        if info:
            out.append({"id": broker_id, **{k.decode(): v.decode() for k, v in info.items()}})
    return out


def live_clients(client: RedisClient, brokers: list[dict]) -> list[dict]:
    """The clients the given brokers announced, each with its "broker" id."""
    if not brokers:
        return []
    pipe = client.pipeline(transaction=False)  # not MGET: on a cluster the keys spread
    for b in brokers:
        pipe.get(keys.broker_clients_key(b["id"]))
    announced = pipe.execute()
    return [{"broker": b["id"], **c}
            for b, data in zip(brokers, announced) for c in json.loads(data or "[]")]


def node(broker: dict) -> str:
    """A registered broker's HTTP address, as nsqlookupd and nsqadmin name a node."""
    return f"{broker['broadcast_address']}:{broker['http_port']}"


def tombstone(client: RedisClient, topic: str, address: str, lifetime_ms: int) -> None:
    """Leave the broker at HTTP `address` out of the topic's producers for lifetime_ms."""
    _hold(client, TopicKeys.of(topic).tombstones, address, lifetime_ms)


def tombstoned(client: RedisClient, topics: list[str]) -> dict[str, set[str]]:
    """The HTTP addresses of the brokers whose tombstone for each topic still holds."""
    return dict(zip(topics, _holding(client, [TopicKeys.of(t).tombstones for t in topics])))


def deregister(client: RedisClient, topic: str, channel: str, lifetime_ms: int) -> None:
    """nsqlookupd forgot the topic ("") or channel: nsqadmin now sends its delete to
    every broker, of which only the first finds it (see deregistered)."""
    _hold(client, TopicKeys.of(topic).deregistered, channel, lifetime_ms)


def deregistered(client: RedisClient, topic: str, channel: str) -> bool:
    [fields] = _holding(client, [TopicKeys.of(topic).deregistered])
    return channel in fields


def _hold(client: RedisClient, key: str, field: str, lifetime_ms: int) -> None:
    """Set a hash field to the time (ms) it ends; the hash expires with the last one."""
    pipe = client.pipeline(transaction=False)
    pipe.hset(key, field, int(time.time() * 1000) + lifetime_ms)
    pipe.pexpire(key, lifetime_ms)
    pipe.execute()


def _holding(client: RedisClient, hashes: list[str]) -> list[set[str]]:
    """The fields of each hash that have not ended yet."""
    pipe = client.pipeline(transaction=False)  # not one key: on a cluster they spread
    for key in hashes:
        pipe.hgetall(key)
    now = time.time() * 1000
    return [{f.decode() for f, end in ends.items() if int(end) > now}
            for ends in (pipe.execute() if hashes else [])]
