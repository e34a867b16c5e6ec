"""What the console's pages show, read through the store as relay-admin reads it, and
the rates it draws from samples of the totals (Rates).

The overview is read at most once a second (OVERVIEW_TTL, from the end of the last
read) however many browsers poll it, so an open console costs Redis a bounded load
(BENCHMARKS.md: the web console).
"""

import time
from collections import OrderedDict, deque
from typing import Callable

from redis.cluster import RedisCluster

from relay.admin.reading import stats_with_clients
from relay.broker import registry
from relay.liveness import Liveness
from relay.store import Store, deadletter, guarded, keys
from relay.store import stats as relay_stats
from relay.store.connection import is_cluster
from relay.errors import StoreError
from workers import operations

OVERVIEW_TTL = 1.0          # s between two reads of the overview's figures
HISTORY_S = 600             # s of samples kept for the charts
MAX_CHANNELS_SAMPLED = 64   # channels whose samples are kept (least recently shown go)
SCANNER_TTL_MS = 5_000      # workers/scanner.py SHARE_TTL_MS
IN_FLIGHT_SHOWN = 50
COUNTED = ("depth", "in_flight_count", "deferred_count", "message_count", "dead_count")


class Rates:
    """Samples of a few totals, one a second at most, kept HISTORY_S seconds: counters
    drawn as their rate per second between samples (never below 0: a delete resets
    them), levels as they are."""

    def __init__(self, counters: tuple[str, ...], levels: tuple[str, ...]):
        self.counters, self.levels = counters, levels
        self.samples: deque[tuple[float, dict]] = deque()

    def add(self, now: float, totals: dict) -> None:
        if self.samples and now - self.samples[-1][0] < 1:
            return
        self.samples.append((now, {k: totals[k] for k in self.counters + self.levels}))
        while now - self.samples[0][0] > HISTORY_S:
            self.samples.popleft()

    def series(self) -> dict:
        """{"t": [s], counter: [per s], level: [value]} from the second sample on."""
        out: dict = {"t": []} | {k: [] for k in self.counters + self.levels}
        for (t0, before), (t1, after) in zip(self.samples, list(self.samples)[1:]):
            out["t"].append(round(t1, 3))
            for k in self.counters:
                out[k].append(round(max(after[k] - before[k], 0) / (t1 - t0), 1))
            for k in self.levels:
                out[k].append(after[k])
        return out


class Figures:
    """The pages' figures, with the samples their charts are drawn from."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time):
        self.store = store
        self.clock = clock
        self.rates = Rates(("message_count",), ("depth", "in_flight_count"))
        self.channel_rates: OrderedDict[tuple[str, str], Rates] = OrderedDict()
        self._overview: tuple[float, dict] = (float("-inf"), {})

    def overview(self) -> dict:
        """Totals, each topic's, the processes alive and each Redis node's memory."""
        read_at, cached = self._overview
        now = self.clock()
        if now - read_at < OVERVIEW_TTL:
            return cached
        topics = [topic_row(t) for t in relay_stats.collect(self.store)["topics"]]
        totals = {k: sum(t[k] for t in topics) for k in COUNTED}
        totals["channels"] = sum(t["channels"] for t in topics)
        self.rates.add(now, totals)
        live = registry.live_brokers(self.store.redis)
        data = {"topics": topics, "totals": totals, "brokers": live,
                "clients": len(registry.live_clients(self.store.redis, live)),
                "scanners": len(Liveness(self.store.redis, keys.SCANNERS,
                                         SCANNER_TTL_MS).live()),
                "workers": operations.worker_count(self.store.redis),
                "memory": memory(self.store), "rates": self.rates.series()}
        self._overview = (self.clock(), data)     # a second from its end: reads never overlap
        return data

    def topic(self, topic: str) -> dict:
        """Its parts with their masters, retention, TTL, dedup, order rule, channels."""
        [entry] = relay_stats.collect(self.store, topic, by_part=True)["topics"]
        ttls = self.store.expiry.ttl_settings(topic)
        rule = self.store.ordering.order_rule(topic)
        for c in entry["channels"]:
            c["ttl_ms"] = ttls["channels"].get(c["channel_name"], {}).get("ttl_ms")
        return {"topic": entry, "ttl_ms": ttls["ttl_ms"],
                "dedup": self.store.dedup.dedup_report(topic),
                "order_key": rule}

    def channel(self, topic: str, channel: str) -> dict:
        """Counts, consumers by broker, messages in flight with their owners, settings."""
        [t] = stats_with_clients(self.store, topic, channel)["topics"]
        [c] = t["channels"]
        rates = self.channel_rates.pop((topic, channel), None) or Rates(
            ("message_count", "requeue_count", "timeout_count"),
            ("depth", "in_flight_count"))
        rates.add(self.clock(), c)
        self.channel_rates[(topic, channel)] = rates
        while len(self.channel_rates) > MAX_CHANNELS_SAMPLED:
            self.channel_rates.popitem(last=False)
        clients = {cl["owner"]: cl for cl in c["clients"]}
        in_flight = [m | {"client": clients.get(m["owner"], {}).get("remote_address"),
                          "broker": m["owner"].rpartition(":")[0]}
                     for m in relay_stats.in_flight(self.store, topic, channel,
                                                    IN_FLIGHT_SHOWN)]
        by_broker: dict[str, list] = {}
        for client in c["clients"]:
            by_broker.setdefault(client["broker"], []).append(client)
        ttl_ms, source = (self.store.reads.channel_setting(topic, channel, name)
                          for name in ("ttl_ms", "ttl_from"))
        return {"topic": t, "channel": c, "in_flight": in_flight, "by_broker": by_broker,
                "limit": self.store.limits.limit(topic, channel),
                "rate_limit": self.store.limits.rate(topic, channel),
                "ttl": {"ttl_ms": int(ttl_ms) if ttl_ms else None, "source": source},
                "max_attempts": self.store.reads.channel_setting(topic, channel, "max_attempts"),
                "rates": rates.series()}

    def dead_letters(self, topic: str, channel: str, limit: int) -> tuple[list[dict], int]:
        """The first `limit` dead letters of a channel (one per id) and how many there are."""
        seen: set[str] = set()
        shown: list[dict] = []
        for _, _, letter in deadletter.letters(self.store, topic, channel):
            if letter["id"] in seen:
                continue
            seen.add(letter["id"])
            if len(shown) < limit:
                shown.append(letter)
        return shown, len(seen)


def topic_row(t: dict) -> dict:
    """A topic's line in the overview: its counts with its channels' summed in."""
    chs = t["channels"]
    return {"name": t["topic_name"], "partitions": t["partitions"], "channels": len(chs),
            "paused": t["paused"], "message_count": t["message_count"],
            "depth": t["depth"] + sum(c["depth"] for c in chs),
            "in_flight_count": sum(c["in_flight_count"] for c in chs),
            "deferred_count": t["deferred_count"] + sum(c["deferred_count"] for c in chs),
            "dead_count": sum(c["dead_count"] for c in chs)}


def memory(store: Store) -> list[dict]:
    """Each master's used memory and maxmemory (0: none), by host:port; none where
    INFO is refused (renamed away on some managed services; fakeredis has none)."""
    client = store.redis
    try:
        if is_cluster(client):
            infos = guarded(lambda: client.info("memory",
                                                target_nodes=RedisCluster.PRIMARIES))
        else:
            infos = {store.nodes.address(""): guarded(client.info, "memory")}
    except StoreError:
        return []
    return [{"node": node, "used": int(info.get("used_memory", 0)),
             "max": int(info.get("maxmemory", 0))}
            for node, info in sorted(infos.items())]
