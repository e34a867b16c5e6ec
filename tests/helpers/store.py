"""Reading and setting up Store state in tests: ids, bodies and attempts of records,
a channel's queue, due score, in-flight holdings, and the stats of an empty channel."""

import time

from relay.codec import parse_record
from relay.store.inflight import member_id
from relay.store import keys
from relay.store.keys import ChannelKeys, TopicKeys

# the shapes of an order gate's waiting messages, by the data layout in force when the
# channel was made ordered (lib/order.lua)
GATE_SHAPES = {"numbered": 3, "sorted-set": 2}


def now_ms(store) -> int:
    sec, usec = store.redis.time()
    return sec * 1000 + usec // 1000


def wait_past(store, ms: int) -> None:
    """Sleep until Redis time is at least `ms` (what the scripts compare with)."""
    while now_ms(store) < ms:
        time.sleep(0.002)


def mid(n: int) -> bytes:
    return b"%016x" % n


def ids(records) -> list:
    return [parse_record(r)[2] for r in records]


def bodies(records) -> list:
    return [parse_record(r)[3] for r in records]


def attempts(records) -> list:
    return [parse_record(r)[1] for r in records]


def queue(store, topic, channel) -> list:
    return store.redis.lrange(ChannelKeys.of(topic, channel).queue, 0, -1)


def due_score(store, topic, channel):
    score = store.redis.zscore(TopicKeys.of(topic).due, channel)
    return None if score is None else int(score)


def holder_of(store, topic, channel, msg_id: bytes):
    """(owner, deadline ms) of an in-flight message, from its member in the inflight ZSET;
    None if it is not in flight."""
    for member, score in store.redis.zrange(ChannelKeys.of(topic, channel).inflight, 0, -1,
                                            withscores=True):
        if member_id(member) == msg_id:
            return member[len(msg_id) + 1:].decode(), int(score)
    return None


def inflight_score(store, topic, channel, msg_id: bytes):
    holding = holder_of(store, topic, channel, msg_id)
    return None if holding is None else holding[1]


def empty_channel(**overrides) -> dict:
    base = {"depth": 0, "in_flight_count": 0, "deferred_count": 0, "message_count": 0,
            "requeue_count": 0, "timeout_count": 0, "dead_count": 0, "deleted_count": 0,
            "expired_count": 0, "overflow_count": 0, "client_count": 0, "paused": False,
            "ordered": False, "order_keys_out": 0, "order_waiting": 0, "rate_limit": None}
    return {**base, **overrides}


def subscribed(store, topic="t", channel="c", broker="b1"):
    assert store.subscribe(topic, channel, broker) is True
    return store


def channel_state(store, channel="spark", topic="events") -> tuple:
    """(depth, in flight, timed out) of a channel."""
    state = store.reads.read_channel(topic, channel)
    return state["depth"], state["in_flight_count"], state["timeout_count"]


def parts_of(store, topic="t", channel="c", field="depth") -> list:
    """A figure of read_channel_parts (depth unless named) for each part of a channel."""
    return [p[field] for p in store.reads.read_channel_parts(topic, channel)]


def ordered(store, topic="t", channel="c"):
    """An ordered channel (relay/store/ordering.py) with a consumer counted on broker b1."""
    subscribed(store, topic, channel)
    assert store.ordering.set_ordered(topic, channel, True) == 0
    return store


def gate_shaped(store, shape: str):
    """The Store with the data layout in force whose ordered channels wait in `shape`
    (GATE_SHAPES)."""
    store.redis.set(keys.LAYOUT, GATE_SHAPES[shape])
    return store


def gate_keys(store, topic="t", channel="c") -> list:
    """The keys of a channel's order gate that exist, and the fields of its msgs hash
    that number messages waiting (ids have no space)."""
    c = ChannelKeys.of(topic, channel)
    return [k.encode() for k in (c.gate, c.key_of, c.waiting) if store.redis.exists(k)] \
        + sorted(f for f in store.redis.hkeys(c.msgs) if b" " in f)


def waiting_bodies(store, topic="t", channel="c") -> dict:
    """{order key: bodies waiting behind it, in their order} of a channel's part."""
    waiting: dict[str, list[bytes]] = {}
    for w in store.ordering.waiting_in(topic, channel):
        waiting.setdefault(w.key.decode(), []).append(parse_record(w.record)[3])
    return waiting


def publish_ordered(store, pairs, topic="t", defer_ms=0):
    """Publish (order key or None, body) pairs: one call per part."""
    store.dedup.publish_keyed(topic, [body for _, body in pairs], None, defer_ms,
                        [key and key.encode() for key, _ in pairs])
