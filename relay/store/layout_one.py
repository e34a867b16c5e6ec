"""Data of layout 1, what relay wrote before issue 35 (2026-11-25), which no release since
writes and this one does not read (relay/store/layout.py runs find_layout_one on a Redis
without `relay:layout`, so one that still holds such data is refused, not misread):

- a message in flight as the bare member "<id>" of its inflight ZSET, with
  "<delivered ms> <owner>" in the channel's `relay:{T}:ch:C:leases` HASH;
- a stored record in the wire layout, [timestamp][attempts][id][body], whose timestamp
  has no mark (codec.STORED): in a channel's queue, msgs hash or dead-letter outbox
  (plain, or after its "<reason>:"), a topic's backlog or deferred backlog, a Spark
  batch's claims;
- news counted in the field `news` of a part's version key and nowhere else: a Redis of
  layout 1 has no node news hash (relay/store/nodes.py). Layout 2 counts a part's news
  there too where a stale slot map kept it from the node hash (scripts/lib/news.lua),
  but only on a node whose news hash exists, bar a node that a resharding has just
  brought into a cluster.

Each master's keys are walked once with SCAN and the records of those that hold some
are read whole, in chunks, up to the first one found: this runs once per deployment.
"""

import re
from typing import Iterator, cast

import redis

from relay.codec import STORED
from relay.store import nodes
from relay.store.connection import RedisClient, is_cluster
from relay.store.deadletter import TAGGED
from relay.store.keys import PREFIX

CHUNK = 1000
MARK = STORED >> 56           # the mark, in a stored record's first byte
_VERSION = re.compile(re.escape(PREFIX) + r":\{(.+)\}:version")


def find_layout_one(client: RedisClient) -> str | None:
    """None when the Redis holds no data of layout 1, else what the first found is, e.g.
    "relay:{t}:ch:c:leases (3 messages in flight of layout 1)"."""
    prefixes = nodes.Nodes(client)
    for node in _masters(client):
        for raw in node.scan_iter(match=f"{PREFIX}:{{*", count=CHUNK):
            key = raw.decode()
            found = _leftover(node, key, prefixes)
            if found:
                return found
    return None


def _masters(client: RedisClient) -> list[redis.Redis]:
    """A client of each master (the server alone on one server)."""
    if not is_cluster(client):
        return [cast(redis.Redis, client)]
    return [client.get_redis_connection(node) for node in client.get_primaries()]


def _leftover(node: redis.Redis, key: str, prefixes: nodes.Nodes) -> str | None:
    """What of layout 1 `key` (on `node`) holds, or None."""
    if ":trash:" in key or ":staging:" in key:
        return None           # being freed; bodies, not records
    if ":ch:" in key and key.endswith(":leases"):
        held = node.hlen(key)
        return f"{key} ({held} message{'s' * (held != 1)} in flight of layout 1)"
    if key.endswith((":queue", ":backlog")) or (":spark:" in key and ":batch:" in key):
        old = any(map(_old_record, _list(node, key)))
    elif ":ch:" in key and key.endswith(":msgs"):
        old = any(_old_record(r) for _, r in node.hscan_iter(key, count=CHUNK))
    elif key.endswith(":backlog:deferred"):
        old = any(_old_record(r) for r, _ in node.zscan_iter(key, count=CHUNK))
    elif ":ch:" in key and key.endswith(":dead"):
        old = any(map(_old_entry, _list(node, key)))
    elif version := _VERSION.fullmatch(key):
        return _old_news(node, key, version[1], prefixes)
    else:
        return None
    return f"a record of layout 1 in {key}" if old else None


def _list(node: redis.Redis, key: str) -> Iterator[bytes]:
    start = 0
    while chunk := cast(list, node.lrange(key, start, start + CHUNK - 1)):
        yield from chunk
        start += CHUNK


def _old_record(record: bytes) -> bool:
    return bool(record) and record[0] < MARK


def _old_entry(entry: bytes) -> bool:
    """Whether a dead-letter outbox entry holds a record of layout 1."""
    tagged = TAGGED.match(entry)
    return _old_record(entry[tagged.end():] if tagged else entry)


def _old_news(node: redis.Redis, key: str, part: str, prefixes: nodes.Nodes) -> str | None:
    """The version key of a part whose news only layout 1 counted: its field `news`, and
    no news hash on its node."""
    news = prefixes.prefix(part) + nodes.NEWS
    if node.hget(key, "news") is None or node.exists(news):
        return None
    return f"{key} (news of layout 1: no {news} on its node)"
