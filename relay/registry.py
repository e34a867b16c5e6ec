"""The broker registry: each broker announces itself in Redis with a TTL heartbeat, so
any broker can answer nsqlookupd's questions (/lookup, /nodes) for all of them.

A broker killed with -9 drops out when its registration expires (3 heartbeats).
"""

import logging
import time

import gevent
import redis

from relay.store import keys

log = logging.getLogger("relay.registry")

HEARTBEAT = 5.0
TTL_MS = 15_000


class Registry:
    def __init__(self, client: redis.Redis, broker_id: str):
        self.redis = client
        self.id = broker_id
        self.info: dict = {}

    def register(self, info: dict) -> None:
        """Announce now, then every HEARTBEAT seconds (call in a greenlet)."""
        self.info = info
        while True:
            try:
                self._announce()
            except redis.exceptions.RedisError as e:
                log.warning("could not announce broker %s: %s", self.id, e)
            gevent.sleep(HEARTBEAT)

    def _announce(self) -> None:
        key = keys.broker_key(self.id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, mapping=self.info)
        pipe.pexpire(key, TTL_MS)
        pipe.zadd(keys.BROKERS, {self.id: int(time.time() * 1000) + TTL_MS})
        pipe.execute()

    def leave(self) -> None:
        try:
            self.redis.pipeline(transaction=False).zrem(keys.BROKERS, self.id).delete(
                keys.broker_key(self.id)).execute()
        except redis.exceptions.RedisError as e:
            log.warning("could not deregister broker %s: %s", self.id, e)


def live_brokers(client: redis.Redis) -> list[dict]:
    """Registrations that have not expired, oldest id first; expired ones are dropped."""
    now = int(time.time() * 1000)
    client.zremrangebyscore(keys.BROKERS, "-inf", now)
    ids = client.zrangebyscore(keys.BROKERS, now, "+inf")
    pipe = client.pipeline(transaction=False)
    for broker_id in ids:
        pipe.hgetall(keys.broker_key(broker_id.decode()))
    out = []
    for broker_id, info in zip(ids, pipe.execute()):
        if info:
            out.append({"id": broker_id.decode(),
                        **{k.decode(): v.decode() for k, v in info.items()}})
    return sorted(out, key=lambda b: b["id"])
