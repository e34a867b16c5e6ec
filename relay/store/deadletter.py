"""Dead letters: messages that reached max attempts or expired (or that another control
turned away), kept readable in a dead-letter topic.

deliver.lua moves a message that was already delivered max-attempts times, or that is
older than its channel's TTL, into its channel's outbox (same hash slot, so one atomic
step); an outbox entry is the record, or "<reason>:<record>" for any other reason than
max attempts (split_entry, lib/deadletter.lua). A scanner publishes the outbox to the
dead-letter topic through publish.lua and then drops what it published. A scanner
killed in between publishes those again: dead letters are at least once, like every
relay delivery. The channel remembers the dead-letter topic its letters last went to,
so `dlq` and `redrive` find them without the scanner's options.

A dead letter's body is a JSON envelope with the original topic, channel, id,
attempts, first-publish timestamp (ns), reason and body (text, or base64 in
`body_base64` when not UTF-8), so an NSQ consumer or `relay-admin dlq` can read
it and `redrive` can queue the original message again.
"""

import base64
import binascii
import itertools
import json
import re
import secrets
from typing import Sequence

from relay import codec
from relay.errors import StoreError
from relay.options import DEFAULT_DEAD_LETTER_TOPIC
from relay.store import Op, Store, codes, guarded
from relay.store.dedup import key_part
from relay.store.keys import ChannelKeys, TopicKeys, id_part, split_part

FORWARD_BATCH = 500
CLAIM_MS = 10_000
REASONS = ("max_attempts", "expired", "overflow")
TAGGED = re.compile(rb"([a-z_]+):")      # an outbox entry's reason (split_entry)
DEFAULT_TEMPLATE = DEFAULT_DEAD_LETTER_TOPIC
LAST_TOPIC = "dead_letters_in"     # channel meta: where its scanner last sent letters


def topic_for(store: Store, topic: str, channel: str, template: str) -> str:
    """The channel's own dead-letter topic, else the template ('{topic}.dead')."""
    return (store.reads.channel_setting(topic, channel, "dead_letter_topic")
            or template.format(topic=topic))


def split_entry(entry: bytes) -> tuple[str, bytes]:
    """(reason, record) of an outbox entry: a record starts with a byte of 128 or more
    (its timestamp's mark, codec.STORED), a tagged entry with its reason, [a-z_], and a
    colon."""
    tagged = TAGGED.match(entry)
    if tagged:
        return tagged[1].decode(), entry[tagged.end():]
    return REASONS[0], entry


def envelope(topic: str, channel: str, record: bytes, reason: str = REASONS[0]) -> bytes:
    ts, attempts, msg_id, body = codec.parse_record(record)
    letter = {"topic": topic, "channel": channel, "id": msg_id.decode(), "attempts": attempts,
              "timestamp": ts, "reason": reason}
    try:
        letter["body"] = body.decode()
    except UnicodeDecodeError:
        letter["body_base64"] = base64.b64encode(body).decode()
    return json.dumps(letter, separators=(",", ":")).encode()


def read_envelope(body: bytes) -> dict | None:
    """The letter in a dead-letter message body, or None if it is not one."""
    try:
        letter = json.loads(body)
        if "body_base64" in letter:
            letter["body_bytes"] = base64.b64decode(letter["body_base64"], validate=True)
        else:
            letter["body_bytes"] = letter["body"].encode()
        if len(letter["id"]) != codec.MSG_ID_LENGTH or letter.get("reason") not in REASONS:
            return None
        return letter
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        return None


def claim_outbox(store: Store, topic: str, channel: str, token: str, ms: int,
                 count: int) -> list:
    """Up to `count` entries of the dead-letter outbox (split_entry), if no other scanner
    holds it."""
    c = ChannelKeys.of(topic, channel)
    if not guarded(lambda: store.redis.set(c.dead_lock, token, nx=True, px=ms)):
        return []
    records = guarded(store.redis.lrange, c.dead, 0, count - 1)
    if not records:
        guarded(store.redis.delete, c.dead_lock)
    return records


def drop_outbox(store: Store, topic: str, channel: str, count: int) -> None:
    """Forget the first `count` outbox records (published) and release the claim."""
    c = ChannelKeys.of(topic, channel)
    pipe = store.redis.pipeline(transaction=False)
    pipe.ltrim(c.dead, count, -1)
    pipe.delete(c.dead_lock)
    guarded(pipe.execute)


def forward(store: Store, part: str, channel: str, template: str) -> int:
    """Publish the outbox of a channel's part (keys.part_name) to its dead-letter topic;
    how many were published."""
    topic = split_part(part)[0]
    token, done = secrets.token_hex(8), 0
    while True:
        entries = claim_outbox(store, part, channel, token, CLAIM_MS, FORWARD_BATCH)
        if not entries:
            return done
        target = topic_for(store, topic, channel, template)
        if not codec.is_valid_name(target):
            drop_outbox(store, part, channel, 0)
            raise StoreError(f"dead-letter topic {target!r} of {topic}/{channel} is not a "
                             "valid topic name; set one with relay-admin config")
        store.publish(target, [envelope(topic, channel, record, reason)
                               for reason, record in map(split_entry, entries)])
        if store.reads.channel_setting(topic, channel, LAST_TOPIC) != target:
            store.control.configure_channel(topic, channel, LAST_TOPIC, target)
        drop_outbox(store, part, channel, len(entries))
        done += len(entries)


def _sources(store: Store, dead_topic: str) -> list[str]:
    """Where a dead-letter topic's messages wait: its parts' backlogs and channel queues."""
    return [key for part in store.parts(dead_topic)
            for key in [TopicKeys.of(part).backlog] + [
                ChannelKeys.of(part, ch).queue for ch in store.reads.channel_names(part)]]


def letters(store: Store, topic: str, channel: str, chunk: int = 1000):
    """(list key, raw record, letter) for each dead letter of topic/channel still waiting
    in the topic its scanner last published them to."""
    dead_topic = (store.reads.channel_setting(topic, channel, LAST_TOPIC)
                  or DEFAULT_TEMPLATE.format(topic=topic))
    for key in _sources(store, dead_topic):
        start = 0
        while True:
            records = guarded(store.redis.lrange, key, start, start + chunk - 1)
            for record in records:
                letter = read_envelope(codec.parse_record(record)[3])
                if letter and (letter["topic"], letter["channel"]) == (topic, channel):
                    yield key, record, letter
            if len(records) < chunk:
                break
            start += chunk


def redrive_op(topic: str, channel: str, records: Sequence[bytes], node: str,
               order_keys: "Sequence[bytes | None] | None" = None,
               counted: bool = False) -> Op:
    """Queue records on one channel (part) again: how many, or codes.REDRIVE_NO_CHANNEL
    if there is no such channel. `node`: the prefix of the node keys of the node serving
    the topic (Store.node). On an ordered channel the records it still holds are skipped
    and those with an order key (one or None per record) pass its gate (redrive.lua);
    `counted`: they count in its message_count (a replay's)."""
    t, c = TopicKeys.of(topic), ChannelKeys.of(topic, channel)
    joined = b"\n".join(k or b"" for k in order_keys) if order_keys and any(order_keys) \
        else b""
    return Op("redrive", [t.channels, c.queue, t.version, c.meta, c.msgs, c.gate, c.key_of,
                          c.waiting, c.urgent],
              [channel, t.wake, node, int(counted), joined, *records])


def rule_keys(store: Store, topic: str, part: int, records: Sequence[bytes]
              ) -> "list[bytes | None] | None":
    """The order keys the topic's rule gives records of its part `part` (relay/store/
    ordering.py), None without a rule: neither the history nor a dead letter keeps the
    key a message was published with. A key whose messages go to another part (the
    record was published without it, on a partitioned topic) is none: a key is ordered
    within its own part only."""
    rule = store.ordering.order_rule(topic)
    if rule is None:
        return None
    partitions = store.partitions(topic)
    keys = []
    for record in records:
        key = rule.key_of(codec.parse_record(record)[3])
        keys.append(key if key is not None and (
            partitions == 1 or key_part(key, partitions) == part) else None)
    return keys


def _redrive(store: Store, topic: str, channel: str, records: dict) -> int:
    """Queue records (by id) again, each on the part its id names, an ordered channel's
    through its gate with the keys of the topic's rule (rule_keys): how many, or
    codes.REDRIVE_NO_CHANNEL if there is no such channel."""
    by_part: dict[int, list] = {}
    for msg_id, record in records.items():
        by_part.setdefault(max(id_part(msg_id.encode()), 0), []).append(record)
    queued = store.run_many([redrive_op(store.part(topic, i), channel, part,
                                        store.node(store.part(topic, i)),
                                        rule_keys(store, topic, i, part))
                             for i, part in by_part.items()])
    for reply in queued:
        if isinstance(reply, Exception):
            raise reply
    if codes.REDRIVE_NO_CHANNEL in queued:
        return codes.REDRIVE_NO_CHANNEL
    return sum(queued)


def _remove(store: Store, key: str, records: Sequence[bytes]) -> None:
    """LREM each record once."""
    pipe = store.redis.pipeline(transaction=False)
    for record in records:
        pipe.lrem(key, 1, record)  # type: ignore[arg-type]  # redis-py: str
    guarded(pipe.execute)


def redrive_ids(store: Store, topic: str, channel: str, ids: set[str]) -> int:
    """Queue the dead letters with these ids on the channel again and remove every copy
    of them from the dead-letter topic (queued first: at least once); how many."""
    found: dict[str, bytes] = {}
    copies: dict[str, list[bytes]] = {}
    for key, record, letter in letters(store, topic, channel):
        if letter["id"] in ids:
            found.setdefault(letter["id"], codec.make_record(
                letter["timestamp"], 0, letter["id"].encode(), letter["body_bytes"]))
            copies.setdefault(key, []).append(record)
    if found and _redrive(store, topic, channel, found) == codes.REDRIVE_NO_CHANNEL:
        raise StoreError(f"channel {topic}/{channel} does not exist")
    for key, records in copies.items():
        _remove(store, key, records)
    return len(found)


def redrive(store: Store, topic: str, channel: str, chunk: int = 1000):
    """Queue a channel's dead letters on it again (original id and timestamp, attempts
    0) and remove them from the dead-letter topic, a chunk at a time; yields progress.
    The cut: the letters waiting at the start. At least once: each chunk is queued
    before it is removed; copies of one letter (one per dead-letter channel) go once."""
    progress = {"done": 0, "requeued": 0,
                "total": sum(1 for _ in letters(store, topic, channel, chunk))}
    yield progress
    seen: set[str] = set()
    handled = 0
    while handled < progress["total"]:
        batch = list(itertools.islice(letters(store, topic, channel, chunk),
                                      min(chunk, progress["total"] - handled)))
        if not batch:
            return
        fresh = {}
        for _, _, letter in batch:
            if letter["id"] not in seen:
                fresh[letter["id"]] = codec.make_record(letter["timestamp"], 0,
                                                        letter["id"].encode(),
                                                        letter["body_bytes"])
        if fresh and _redrive(store, topic, channel, fresh) == codes.REDRIVE_NO_CHANNEL:
            raise StoreError(f"channel {topic}/{channel} does not exist")
        seen.update(fresh)
        for key in {key for key, _, _ in batch}:
            _remove(store, key, [record for k, record, _ in batch if k == key])
        handled += len(batch)
        progress["done"], progress["requeued"] = handled, len(seen)
        yield progress
