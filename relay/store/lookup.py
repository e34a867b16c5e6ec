"""Finding one message by id in a channel, looking at what waits without taking it, and
taking one waiting message out (relay-admin msg and peek).

A message id names its part (keys.id_part), so only that part's keys are read. Where
it is, cheapest first: in flight or deferred (its record in the msgs hash: O(1)), in
the dead-letter outbox (a scan of a short list), on an ordered channel waiting behind its
order key (a read of what waits, only for an id with no key out while some wait),
then queued (a scan of the queue, head first, SCAN_CHUNK records per LRANGE: a queued
record holds the id at its end, so LPOS, which compares whole elements, cannot find it). On an
ordered channel each place carries the message's order key ("key": None for none): of a
message out, from key_of; of one waiting, from where it waits (ordering.Waiting).
"""

from itertools import islice
from typing import Callable, Iterable

from relay.codec import MAX_PRIORITY, parse_record, record_id
from relay.store import Op, Store, deadletter, guarded
from relay.store.inflight import expand, is_lot, member_id, member_owner
from relay.store.keys import ChannelKeys, TopicKeys, id_part, id_priority
from relay.store.ordering import ORDERED_FIELD, WAITING_FIELD, Waiting

SCAN_CHUNK = 10_000


def where(store: Store, topic: str, channel: str, msg_id: bytes,
          owners: Iterable[str] = ()) -> dict:
    """Where msg_id is in the channel: {"state": "in_flight" | "deferred" | "dead" |
    "waiting" | "queued" | "absent", ...} with what it holds (message()) and, per state,
    its owner and deadline (ms), due time (ms) or position (1: the head; waiting: behind
    its key's message out, 1 next), the dead letter's reason and the list's or waiting
    ZSET's element ("record"); on an ordered channel its order key ("key"), and for one
    waiting with a defer its due time. `owners`: the owners to try first for a message
    in flight (the registry's clients), before a ZSCAN."""
    part = id_part(msg_id)
    if not 0 <= part < len(store.parts(topic)):
        return {"state": "absent"}
    c = ChannelKeys.of(store.part(topic, part), channel)
    pipe = store.redis.pipeline(transaction=False)
    pipe.hget(c.msgs, msg_id)
    pipe.zscore(c.deferred, msg_id)
    pipe.hget(c.key_of, msg_id)
    pipe.hmget(c.meta, ORDERED_FIELD, WAITING_FIELD)
    pipe.zcard(c.waiting)
    record, due, key, (ordered, numbered), in_set = guarded(pipe.execute)
    behind = in_set or int(numbered or 0)
    keyed = {"key": _text(key)} if ordered is not None else {}
    if record is not None and due is not None:
        return {"state": "deferred", "due_ms": int(due), **message(record), **keyed}
    if record is not None:
        held = _holder(store, c, msg_id, list(owners))
        if held is not None:    # the record counts the deliveries before this one
            found = message(record)
            found["attempts"] += 1
            return {"state": "in_flight", **held, **found, **keyed}
    elif (lotted := _in_lot(store, c, msg_id)) is not None:
        held, record = lotted
        found = message(record)
        found["attempts"] += 1
        return {"state": "in_flight", **held, **found, **keyed}
    position, entry = _scan(store, c.dead, msg_id, lambda e: deadletter.split_entry(e)[1])
    if entry is not None:
        reason, record = deadletter.split_entry(entry)
        return {"state": "dead", "position": position, "reason": reason, **message(record),
                "record": entry, **keyed}
    if behind and key is None and (waiting := _waiting(store, c, msg_id)) is not None:
        return waiting
    position, record = _queued(store, c, msg_id)
    if record is not None:
        return {"state": "queued", "position": position, **message(record), "record": record,
                **keyed}
    return {"state": "absent", **keyed}


def _queued(store: Store, c: ChannelKeys, msg_id: bytes) -> tuple[int, bytes | None]:
    """(position from 1 at the head of what goes out next, record) of msg_id ready: in
    its priority's list, behind the messages of higher priorities, or for priority 0 in
    the queue behind all the urgent ones (lib/queue.lua); (0, None) if it is not."""
    priority = id_priority(msg_id)
    ahead = sum(int(n) for p, n in guarded(store.redis.hgetall, c.urgent).items()
                if int(p) > priority)
    position, record = _scan(store, c.urgent_list(priority) if priority else c.queue, msg_id)
    return (ahead + position, record) if record else (0, None)


def _waiting(store: Store, c: ChannelKeys, msg_id: bytes) -> dict | None:
    """where() of msg_id waiting behind its order key: a read of what waits in its
    part, in order, until it is found."""
    for w in store.ordering.waiting_in(c.topic, c.name):
        if w.id == msg_id:
            return {"state": "waiting", "position": w.position,
                    **({"due_ms": w.due_ms} if w.due_ms else {}),
                    **message(w.record), "record": w.element, "key": _text(w.key)}
    return None


def _text(key: bytes | None) -> str | None:
    return None if key is None else key.decode(errors="replace")


def _holder(store: Store, c: ChannelKeys, msg_id: bytes, owners: list[str]) -> dict | None:
    """The owner and deadline of msg_id in flight: one ZMSCORE of the members the given
    owners would make, else a ZSCAN of the in-flight set for "<id> *" (an owner no live
    broker announces)."""
    members = [msg_id + b" " + o.encode() for o in owners]
    scores = guarded(store.redis.zmscore, c.inflight, members) if members else []
    for owner, score in zip(owners, scores):
        if score is not None:
            return {"owner": owner, "deadline_ms": int(score)}
    for member, score in guarded(lambda: list(store.redis.zscan_iter(
            c.inflight, match=msg_id + b" *", count=SCAN_CHUNK, score_cast_func=float))):
        return {"owner": member_owner(member), "deadline_ms": int(score)}
    return None


def _in_lot(store: Store, c: ChannelKeys, msg_id: bytes) -> tuple[dict, bytes] | None:
    """_holder's answer and the record for msg_id in flight in a lot
    (lib/inflight.lua): a ZSCAN of the in-flight set, each lot's messages read until it
    is found."""
    lots = [(m, s) for m, s in guarded(lambda: list(store.redis.zscan_iter(
        c.inflight, count=SCAN_CHUNK, score_cast_func=float))) if is_lot(m)]
    for start in range(0, len(lots), SCAN_CHUNK):
        for member, score, record in expand(store.redis, c.msgs,
                                            lots[start:start + SCAN_CHUNK]):
            if member_id(member) == msg_id and record is not None:
                return {"owner": member_owner(member), "deadline_ms": int(score)}, record
    return None


def _scan(store: Store, key: str, msg_id: bytes,
          record_of: Callable[[bytes], bytes] = lambda element: element
          ) -> tuple[int, bytes | None]:
    """(position from 1 at the head, element) of the first element of the list whose
    record (`record_of` it: an outbox entry's is tagged) is msg_id's, else (0, None)."""
    start = 0
    while elements := guarded(store.redis.lrange, key, start, start + SCAN_CHUNK - 1):
        for i, element in enumerate(elements):
            if record_id(record_of(element)) == msg_id:
                return start + i + 1, element
        start += SCAN_CHUNK
    return 0, None


def remove(store: Store, topic: str, channel: str, state: str, msg_id: bytes,
           record: bytes) -> bool:
    """Take a queued (its exact record), deferred or waiting (its Waiting.element, as
    `record`) message out of the channel in one script call (remove.lua); False if it
    was no longer there."""
    part = store.part(topic, id_part(msg_id))
    t, c = TopicKeys.of(part), ChannelKeys.of(part, channel)
    target = {"queued": record, "waiting": record}.get(state, msg_id)
    return bool(store.run(Op("remove", [c.queue, c.deferred, c.msgs, c.meta, c.gate, c.key_of,
                                        c.waiting, t.due, t.version, c.urgent],
                             [state, target, channel, t.wake, store.node(part), msg_id])))


def queued(store: Store, topic: str, channel: str, limit: int) -> list[dict]:
    """The first `limit` queued messages of each part, part 0 first, each part's in
    the order it delivers them: id, timestamp, attempts, body, part, position."""
    out = []
    for index, part in enumerate(store.parts(topic)):
        c = ChannelKeys.of(part, channel)
        records: list[bytes] = []
        for name in [c.urgent_list(p) for p in range(MAX_PRIORITY, 0, -1)] + [c.queue]:
            if len(records) < limit:
                records += guarded(store.redis.lrange, name, 0, limit - len(records) - 1)
        out += [message(r) | {"part": index, "position": i + 1} for i, r in enumerate(records)]
    return out[:limit]


def deferred(store: Store, topic: str, channel: str, limit: int) -> list[dict]:
    """The `limit` deferred messages due first over every part, with their due times."""
    out = []
    for index, part in enumerate(store.parts(topic)):
        c = ChannelKeys.of(part, channel)
        entries = guarded(lambda: store.redis.zrange(c.deferred, 0, limit - 1, withscores=True))
        if not entries:
            continue
        records = guarded(store.redis.hmget, c.msgs, [msg_id for msg_id, _ in entries])
        out += [message(r) | {"part": index, "due_ms": int(due)}
                for (_, due), r in zip(entries, records) if r is not None]
    return sorted(out, key=lambda m: m["due_ms"])[:limit]


def waiting(store: Store, topic: str, channel: str, limit: int) -> list[dict]:
    """The first `limit` messages of each part waiting behind their order keys (an
    ordered channel's), part 0 first, each part's in key order and each key's in the
    order they go out: id, timestamp, attempts, body, part, key, position (behind the
    key's message out, 1 next) and due_ms (a publish's defer, None: none)."""
    out = []
    for index, part in enumerate(store.parts(topic)):
        out += [message(w.record) | {"part": index, "key": _text(w.key),
                                     "position": w.position, "due_ms": w.due_ms or None}
                for w in islice(store.ordering.waiting_in(part, channel), limit)]
    return out[:limit]


def with_keys(store: Store, topic: str, channel: str, messages: list[dict]) -> list[dict]:
    """The messages (each with its part's index) of an ordered channel, each with its
    order key ("key", None: none) from its part's key_of: one pipeline."""
    parts = store.parts(topic)
    pipe = store.redis.pipeline(transaction=False)
    for m in messages:
        pipe.hget(ChannelKeys.of(parts[m["part"]], channel).key_of, m["id"])
    keys = guarded(pipe.execute) if messages else []
    return [m | {"key": _text(key)} for m, key in zip(messages, keys)]


def message(record: bytes) -> dict:
    """What a stored record holds: id, timestamp (ns), attempts (the
    deliveries so far), priority (relay/store/priorities.py), body (bytes)."""
    ts, attempts, msg_id, body = parse_record(record)
    return {"id": msg_id.decode(), "timestamp": ts, "attempts": attempts,
            "priority": id_priority(msg_id), "body": body}
