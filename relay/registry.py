"""The broker registry: each broker announces itself in Redis with a TTL heartbeat
(relay/liveness.py), so any broker can answer nsqlookupd's questions (/lookup, /nodes)
for all of them, and `relay-admin` can show every broker's clients.

A broker killed with -9 drops out when its registration expires (3 heartbeats), and
its clients with it; a scanner then reaps what it left in the channels (relay/reaper.py). The clients are announced at each heartbeat and soon after one
subscribes or leaves, so their counters are up to a heartbeat old.
"""

import json
import logging
from typing import Callable

import gevent
import redis
from gevent.event import Event

from relay.liveness import Liveness
from relay.store import keys

log = logging.getLogger("relay.registry")

HEARTBEAT = 5.0
TTL_MS = 15_000
MIN_INTERVAL = 0.5


class Registry:
    def __init__(self, client: redis.Redis, broker_id: str):
        self.redis = client
        self.id = broker_id
        self.brokers = broker_liveness(client)
        self.info: dict = {}
        self.clients: Callable[[], list] = list
        self._changed = Event()

    def register(self, info: dict, clients: Callable[[], list] = list) -> None:
        """Announce now, then every HEARTBEAT seconds or sooner when the clients
        changed, at most every MIN_INTERVAL (call in a greenlet)."""
        self.info, self.clients = info, clients
        while True:
            try:
                self.announce()
            except redis.exceptions.RedisError as e:
                log.warning("could not announce broker %s: %s", self.id, e)
            gevent.sleep(MIN_INTERVAL)
            self._changed.wait(HEARTBEAT - MIN_INTERVAL)
            self._changed.clear()

    def clients_changed(self) -> None:
        self._changed.set()

    def announce(self) -> None:
        key = keys.broker_key(self.id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, mapping=self.info)
        pipe.pexpire(key, TTL_MS)
        pipe.set(keys.broker_clients_key(self.id), json.dumps(self.clients()), px=TTL_MS)
        self.brokers.heartbeat(self.id, pipe)
        pipe.execute()

    def leave(self) -> None:
        try:
            pipe = self.redis.pipeline(transaction=False)
            self.brokers.leave(self.id, pipe)
            pipe.delete(keys.broker_key(self.id))  # one key each: they may be on two nodes
            pipe.delete(keys.broker_clients_key(self.id))
            pipe.execute()
        except redis.exceptions.RedisError as e:
            log.warning("could not deregister broker %s: %s", self.id, e)


def broker_liveness(client: redis.Redis) -> Liveness:
    return Liveness(client, keys.BROKERS, TTL_MS)


def live_brokers(client: redis.Redis) -> list[dict]:
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


def live_clients(client: redis.Redis, brokers: list[dict]) -> list[dict]:
    """The clients the given brokers announced, each with its "broker" id."""
    if not brokers:
        return []
    pipe = client.pipeline(transaction=False)  # not MGET: on a cluster the keys spread
    for b in brokers:
        pipe.get(keys.broker_clients_key(b["id"]))
    announced = pipe.execute()
    return [{"broker": b["id"], **c}
            for b, data in zip(brokers, announced) for c in json.loads(data or "[]")]
