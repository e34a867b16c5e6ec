"""Liveness: processes of one kind that announce they are alive, brokers
(relay/broker/registry.py: 5 s heartbeat, 15 s TTL) and scanners (workers/scanner.py: 1 s
heartbeat, 5 s TTL).

Each heartbeat scores the member in a sorted set with the expiry (ms) of its
registration; a member killed with -9 stops renewing it and drops out when it
expires, and the next read removes it. Members are commands on one key, outside the
queue scripts, so on a cluster it may live on any node; heartbeats go through
bookkeeping.lua, so they go on at Redis' maxmemory (relay/store/bookkeeping.py).
"""

import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

from relay.store import bookkeeping

if TYPE_CHECKING:
    from relay.store.connection import RedisClient


class Liveness:
    def __init__(self, client: "RedisClient", key: str, ttl_ms: int, clock=time.time):
        self.redis = client
        self.key = key
        self.ttl_ms = ttl_ms
        self.clock = clock

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def heartbeat_write(self, member: str) -> tuple[Any, ...]:
        """The bookkeeping write that registers `member` until ttl_ms from now, for a
        caller that sends it with its own."""
        return ("ZADD", self.key, self._now_ms() + self.ttl_ms, member)

    def heartbeat(self, member: str) -> None:
        """Register `member` until ttl_ms from now."""
        bookkeeping.write(self.redis, self.heartbeat_write(member))

    def live(self) -> list[str]:
        """The members whose registration has not expired, sorted by id; expired ones
        are removed."""
        return self._live(self.redis.pipeline(transaction=False))

    def rank(self, member: str) -> tuple[int, int]:
        """Heartbeat `member`, then (its rank among the live members, sorted by id,
        their number); (0, 1) if it is not among them."""
        self.heartbeat(member)
        live = self.live()
        return (live.index(member) if member in live else 0), max(len(live), 1)

    def _live(self, pipe) -> list[str]:
        pipe.zremrangebyscore(self.key, "-inf", self._now_ms())
        pipe.zrange(self.key, 0, -1)
        return sorted(m.decode() for m in pipe.execute()[-1])

    def leave(self, member: str, pipe=None) -> None:
        """Deregister `member` now rather than when its registration expires."""
        (self.redis if pipe is None else pipe).zrem(self.key, member)


def new_id() -> str:
    """An id for a process that registers: host, pid and 6 hex digits, as in
    "vm-4113-8c1f20" (ids sort by host)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
