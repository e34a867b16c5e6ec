"""Stats read from Redis, in nsqd's /stats field names (topics -> channels), and the
in-flight messages of a channel (relay-admin inflight): the store's own view, without a
broker (relay-admin; a broker's /stats adds its clients, relay/broker/client.py).

Every message of relay is in Redis, so `backend_depth` equals `depth`;
e2e_processing_latency comes from relay/store/latency.py.
"""

import datetime
import time
from collections import Counter
from typing import Sequence

from relay.codec import is_ephemeral, parse_record
from relay.sockio import Turns
from relay.store import Store, guarded
from relay.store.history import Retained
from relay.store.inflight import expand, member_id, member_owner
from relay.store.keys import ChannelKeys
from relay.store.latency import NO_LATENCY, E2eLatency, describe, percentiles
from relay.store.replies import summed

def collect(store: Store, topic: str | None = None, channel: str | None = None,
            latency: E2eLatency | None = None, by_part: bool = False) -> dict:
    """{"topics": [...]} for every topic, or the one topic / channel asked for (if it
    exists); counts summed over a topic's partitions, and with `by_part` each part's
    own under "parts" too, with the master serving it (host:port). Every topic, then
    every channel, is read in a few pipelines (Reads.read_topic_states, read_channels):
    5,000 channels took 5,000 round trips."""
    names = [n for n in store.reads.topic_names() if not topic or n == topic]
    part_names = store.parts_of(names)
    states = store.reads.read_topic_states(list(zip(names, part_names)))
    wanted = [[ch for ch in channels if not channel or ch == channel]
              for _, _, channels in states]
    figures = iter(store.reads.read_channels([(parts, ch) for parts, chs in zip(part_names, wanted)
                                        for ch in chs]))
    turns = Turns()
    topics: list[dict] = []
    kept: list[tuple] = []      # (entry, retention, part names) of topics with it on
    for name, parts_of_topic, (parts, retention, _), chs in zip(names, part_names, states,
                                                                 wanted):
        turns.take()
        t = summed(parts)
        masters = [store.nodes.address(part) for part in parts_of_topic] if by_part else []
        channels = []
        for ch in chs:
            turns.take()
            channel_parts = next(figures)
            c = summed(channel_parts)
            channels.append({"channel_name": ch, "depth": c["depth"],
                             "backend_depth": c["depth"], **c,
                             "ephemeral": is_ephemeral(ch),
                             "e2e_processing_latency": NO_LATENCY,
                             **({"parts": _with_masters(channel_parts, masters)}
                                if by_part else {})})
        topics.append({"topic_name": name, "channels": channels, "depth": t["depth"],
                       "backend_depth": t["depth"], "deferred_count": t["deferred_count"],
                       "message_count": t["message_count"],
                       "message_bytes": t["message_bytes"], "paused": t["paused"],
                       "partitions": len(parts),
                       "e2e_processing_latency": NO_LATENCY,
                       **({"parts": _with_masters(parts, masters)} if by_part else {})})
        if retention != (0, 0):
            kept.append((topics[-1], retention, parts_of_topic))
    if kept:
        _add_retention(store, kept)
    if latency is not None and latency.enabled:
        _add_latency(store, topics, latency)
    return {"topics": topics}


def _with_masters(parts: list[dict], masters: list[str]) -> list[dict]:
    return [{**part, "master": master} for part, master in zip(parts, masters)]


def _add_retention(store: Store, kept: list[tuple]) -> None:
    """A "retention" entry for each topic with retention on: its settings and what it
    retains summed over its parts (and each part's under "parts", if read), from one
    read of every part's history for them all (History.retained_parts)."""
    figures = iter(store.history.retained_parts([p for _, _, parts in kept for p in parts]))
    for entry, (time_ms, max_bytes), parts in kept:
        each = [next(figures) for _ in parts]
        entry["retention"] = {"time_ms": time_ms, "max_bytes": max_bytes, **retained(each)}
        for part, figure in zip(entry.get("parts", []), each):
            part["retention"] = retained([figure])


def retained(parts: Sequence[Retained]) -> dict:
    """What parts retain together: messages, record bytes, the oldest and newest
    message's ms (None when nothing is retained)."""
    oldest = [r.oldest_ms for r in parts if r.oldest_ms is not None]
    newest = [r.newest_ms for r in parts if r.newest_ms is not None]
    return {"retained": sum(r.entries for r in parts), "bytes": sum(r.bytes for r in parts),
            "oldest_ms": min(oldest, default=None), "newest_ms": max(newest, default=None)}


def _add_latency(store: Store, topics: list, latency: E2eLatency) -> None:
    """Per channel, and per topic over its channels (nsqd merges the channels' streams)."""
    pairs = [(t["topic_name"], c["channel_name"]) for t in topics for c in t["channels"]]
    counts = iter(latency.read(store, pairs))
    for t in topics:
        merged: Counter = Counter()
        for c in t["channels"]:
            buckets = next(counts)
            merged.update(buckets)
            c["e2e_processing_latency"] = percentiles(buckets, latency.quantiles)
        if t["channels"]:
            t["e2e_processing_latency"] = percentiles(merged, latency.quantiles)


def in_flight(store: Store, topic: str, channel: str, limit: int) -> list[dict]:
    """The `limit` in-flight messages of a channel due first (over all its parts): id,
    deadline (ms), owner, attempts, order key (None: none, or the channel is not
    ordered)."""
    out = []
    for part in store.parts(topic):
        out += _in_flight_part(store, ChannelKeys.of(part, channel), limit)
    return sorted(out, key=lambda m: m["deadline_ms"])[:limit]


def _in_flight_part(store: Store, c: ChannelKeys, limit: int) -> list[dict]:
    entries = expand(store.redis, c.msgs, guarded(
        lambda: store.redis.zrange(c.inflight, 0, limit - 1, withscores=True)))[:limit]
    if not entries:
        return []
    ids = [member_id(member) for member, _, _ in entries]
    pipe = store.redis.pipeline(transaction=False)
    pipe.hmget(c.msgs, ids)
    pipe.hmget(c.key_of, ids)       # their order keys (lib/order.lua)
    records, order_keys = guarded(pipe.execute)
    out = []
    for (member, deadline, in_lot), record, key in zip(entries, records, order_keys):
        record = in_lot or record
        if record is None:
            continue  # finished meanwhile
        # the record counts the deliveries before this one (lib/queue.lua)
        out.append({"id": member_id(member).decode(), "deadline_ms": int(deadline),
                    "owner": member_owner(member), "attempts": parse_record(record)[1] + 1,
                    "key": key and key.decode(errors="replace")})
    return out


def text(data: dict, health: str, start_time: int, producers: Sequence[dict] = ()) -> str:
    """nsqd's plain-text /stats (httpServer.printStats)."""
    started = datetime.datetime.fromtimestamp(start_time, datetime.timezone.utc)
    lines = ["nsqd v1.3.0 (relay)", f"start_time {started.isoformat()}",
             f"uptime {int(time.time()) - start_time}s", "", f"Health: {health}"]
    if not data["topics"]:
        lines += ["", "Topics: None"]
    else:
        lines += ["", "Topics:"]
    for t in data["topics"]:
        prefix = "*P " if t["paused"] else "   "
        lines.append(f"{prefix}[{t['topic_name']:<15}] depth: {t['depth']:<5} "
                     f"be-depth: {t['backend_depth']:<5} msgs: {t['message_count']:<8} "
                     f"e2e%: {describe(t['e2e_processing_latency'])}")
        for c in t["channels"]:
            prefix = "   *P " if c["paused"] else "      "
            lines.append(
                f"{prefix}[{c['channel_name']:<25}] depth: {c['depth']:<5} "
                f"be-depth: {c['backend_depth']:<5} inflt: {c['in_flight_count']:<4} "
                f"def: {c['deferred_count']:<4} re-q: {c['requeue_count']:<5} "
                f"timeout: {c['timeout_count']:<5} msgs: {c['message_count']:<8} "
                f"e2e%: {describe(c['e2e_processing_latency'])}")
            for client in c.get("clients", []):
                port = client["remote_address"].rpartition(":")[2]
                ident = f"{client['hostname']}:{port} {client['user_agent']}"
                lines.append(
                    f"        [V2 {ident:<21}] state: {client['state']} "
                    f"inflt: {client['in_flight_count']:<4} rdy: {client['ready_count']:<4} "
                    f"fin: {client['finish_count']:<8} re-q: {client['requeue_count']:<8} "
                    f"msgs: {client['message_count']:<8} "
                    f"connected: {int(time.time()) - client['connect_ts']}s")
    lines += ["", "Producers: None" if not producers else "Producers:"]
    for p in producers:
        total = sum(c["count"] for c in p["pub_counts"])
        lines.append(f"   [V2 {p['client_id']:<21}] msgs: {total:<8} "
                     f"connected: {int(time.time()) - p['connect_ts']}s")
        lines += [f"      [{c['topic']:<15}] msgs: {c['count']:<8}" for c in p["pub_counts"]]
    return "\n".join(lines) + "\n"
