"""End-to-end processing latency (publish to FIN) as nsqd's e2e percentiles, for all brokers.

nsqd keeps a quantile stream per channel in memory; relay's channels are served
by many brokers, so each broker counts its FINs in log-spaced buckets and adds
them once a second to a Redis hash per channel and half-window. /stats merges
the current and the previous half-window (nsqd's two rotating streams) of every
channel and reads the percentiles off the merged buckets, within 1% of the
exact value.
"""

import math
import time
from collections import Counter, defaultdict
from typing import Sequence

from relay.store import Store, bookkeeping, guarded
from relay.store.keys import ChannelKeys

GROWTH = 1.02
_LOG_GROWTH = math.log(GROWTH)
NO_LATENCY = {"count": 0, "percentiles": None}


def bucket(latency_ns: int) -> int:
    return int(math.log(max(latency_ns, 1)) / _LOG_GROWTH)


def bucket_value(index: int) -> float:
    """The middle of a bucket (geometric mean of its bounds), in ns."""
    return GROWTH ** (index + 0.5)


def percentiles(counts: dict, quantiles) -> dict:
    """nsqd's Result: {"count", "percentiles": [{"quantile", "value"}]} from bucket counts."""
    total = sum(counts.values())
    if not quantiles:
        return NO_LATENCY
    ordered = sorted(counts.items())
    result = []
    for q in quantiles:
        rank, seen, value = q * total, 0, 0.0
        for index, n in ordered:
            seen += n
            if seen >= rank:
                value = bucket_value(index)
                break
        result.append({"quantile": q, "value": round(value) if total else 0})
    return {"count": total, "percentiles": result}


def human(ns: float) -> str:
    """nsqd's stringy.NanoSecondToHuman."""
    for scale, suffix in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
        if ns > scale:
            return f"{ns / scale:.1f}{suffix}"
    return f"{ns:.1f}ns"


def describe(result: dict) -> str:
    """What nsqd prints after 'e2e%:' in text /stats."""
    return ", ".join(human(p["value"]) for p in result["percentiles"] or [])


class E2eLatency:
    """This broker's unflushed FIN latencies, and reading everyone's back from Redis."""

    def __init__(self, quantiles, window_ms: int, clock=time.time):
        self.quantiles = tuple(quantiles)
        self.half_window_ms = max(window_ms // 2, 1)
        self.clock = clock
        self._pending: dict[tuple, Counter] = defaultdict(Counter)

    @property
    def enabled(self) -> bool:
        return bool(self.quantiles)

    def record(self, topic: str, channel: str, published_ns: int) -> None:
        if self.enabled:
            latency = int(self.clock() * 1e9) - published_ns
            self._pending[(topic, channel)][bucket(latency)] += 1

    def _slot(self) -> int:
        return int(self.clock() * 1000) // self.half_window_ms

    def flush(self, store: Store) -> None:
        """Add pending counts to this half-window's hashes; they expire after two."""
        if not self._pending:
            return
        pending, self._pending = self._pending, defaultdict(Counter)
        slot = self._slot()
        add_buckets(store, slot, pending, (slot + 2) * self.half_window_ms)

    def read(self, store: Store, pairs) -> list[dict]:
        """Bucket counts of each (topic, channel) over the current and previous half-window."""
        slot = self._slot()
        return read_buckets(store, pairs, (slot - 1, slot))


def add_buckets(store: Store, slot: int, counts: dict, expire_at_ms: int) -> None:
    """Add {(topic, channel): {bucket: FINs}} to the hashes of half-window `slot`, as
    bookkeeping writes: FINs go on at Redis' maxmemory, and so do their figures."""
    writes: list[tuple] = []
    for (topic, channel), buckets in counts.items():
        key = ChannelKeys.of(topic, channel).e2e(slot)
        writes += [("HINCRBY", key, index, n) for index, n in buckets.items()]
        writes.append(("PEXPIREAT", key, expire_at_ms))
    guarded(bookkeeping.write, store.redis, *writes)


def read_buckets(store: Store, pairs: Sequence[tuple], slots: Sequence[int]) -> list[dict]:
    """{bucket: FINs} of each (topic, channel), summed over `slots`."""
    pipe = store.redis.pipeline(transaction=False)
    for topic, channel in pairs:
        for slot in slots:
            pipe.hgetall(ChannelKeys.of(topic, channel).e2e(slot))
    replies = iter(guarded(pipe.execute))
    out = []
    for _ in pairs:
        counts: dict = {}
        for _ in slots:
            for k, v in next(replies).items():
                counts[int(k)] = counts.get(int(k), 0) + int(v)
        out.append(counts)
    return out
