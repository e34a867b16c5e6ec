"""Idempotent publish (issue 39): a message published with a key that its topic saw
within the topic's dedup window is not published again (lib/dedup.lua). The window is
a topic setting, the meta field `dedup_ms` of every part (absent: off, as nsqd).

A key always goes to the same part, the one its hash picks, so a retry or a second
broker racing on the key meets the same dedup set. A keyed publish is one script call
per part and per KEYED_BODIES messages: each call is all or nothing, and a retry of the
whole publish with the same keys publishes only what the failed calls did not."""

import re
import zlib
from typing import Sequence

from relay.store import keys
from relay.store.data_path import KEYED_BODIES, Service
from relay.store.keys import TopicKeys
from relay.store.runner import Op, guarded

DEDUP_FIELD = "dedup_ms"
MAX_KEY_BYTES = 256
PRINTABLE_ASCII = re.compile(rb"[!-~]{1,%d}" % MAX_KEY_BYTES)
ASCII_KEY_LINES = re.compile(rb"%s(?:\n%s)*" % ((PRINTABLE_ASCII.pattern,) * 2))


def key_problem(key: bytes) -> str | None:
    """Why `key` cannot be a publish key (an nsqd-style code), or None: 1-256 bytes of
    UTF-8 text without spaces or control characters, so it fits a header line and the
    keyed body format ("KEY BODY")."""
    if PRINTABLE_ASCII.fullmatch(key):
        return None     # most keys, checked at C speed
    if not key:
        return "ID_EMPTY"
    if len(key) > MAX_KEY_BYTES:
        return "ID_TOO_LONG"
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return "ID_NOT_TEXT"
    if not text.isprintable() or " " in text:     # isprintable: no other space
        return "ID_NOT_TEXT"
    return None


class BadKeyedMessage(ValueError):
    """A message of a keyed body that cannot be published: its number (from 1) and
    the code of what is wrong."""

    def __init__(self, number: int, code: str):
        super().__init__(code)
        self.number = number
        self.code = code


def keyed_messages(messages: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """(bodies, keys) of messages in the keyed body format, "KEY BODY" (/mpub?keyed=true,
    MPUB after IDENTIFY relay_dedup); BadKeyedMessage for the first that is not."""
    split = [message.partition(b" ") for message in messages]
    bodies = [body for _, _, body in split]
    publish_keys = [key for key, _, _ in split]
    if all(bodies) and ASCII_KEY_LINES.fullmatch(b"\n".join(publish_keys)):
        return bodies, publish_keys     # most MPUBs: every key checked at C speed at once
    for number, (key, body) in enumerate(zip(publish_keys, bodies), 1):
        problem = key_problem(key) or (None if body else "MSG_EMPTY")
        if problem:
            raise BadKeyedMessage(number, problem)
    return bodies, publish_keys


def key_part(key: bytes, partitions: int) -> int:
    """The part a key's messages always go to (crc32: the same in every broker)."""
    return zlib.crc32(key) % partitions


class Dedup(Service):
    """The dedup window of topics, and publishes with keys."""

    def set_dedup(self, topic: str, window_ms: int) -> None:
        """The topic's window on every part (0: off; the keys remembered go with their
        expiry)."""
        for part in self.store.parts(topic, fresh=True):
            meta = TopicKeys.of(part).meta
            if window_ms:
                guarded(self.redis.hset, meta, DEDUP_FIELD, window_ms)
            else:
                guarded(self.redis.hdel, meta, DEDUP_FIELD)

    def dedup_window(self, topic: str) -> int:
        """The topic's window in ms (part 0's setting); 0 when off."""
        return int(guarded(self.redis.hget, TopicKeys.of(topic).meta, DEDUP_FIELD) or 0)

    def dedup_report(self, topic: str) -> dict:
        """The window and the keys each part remembers (some maybe expired, not yet
        swept), as relay-admin dedup shows them."""
        pipe = self.redis.pipeline(transaction=False)
        parts = self.store.parts(topic)
        for part in parts:
            pipe.zcard(keys.dedup_key(part))
        counts = guarded(pipe.execute)
        window = self.dedup_window(topic)
        return {"topic": topic, "on": window > 0, "window_ms": window,
                "partitions": [{"partition": i, "keys": n} for i, n in enumerate(counts)]}

    def keyed_publish_ops(self, topic: str, bodies: Sequence[bytes],
                          publish_keys: Sequence[bytes] | None, defer_ms: int = 0,
                          order_keys: "Sequence[bytes | None] | None" = None,
                          priorities: Sequence[int] | None = None) -> list[Op]:
        """The calls of a publish with a publish key per body, an order key (or None) per
        body (relay/store/ordering.py), or both (checked by the caller, key_problem),
        and with or without a priority (0-9) per body (data_path.publish_op):
        with publish keys each returns its number of duplicates, else the count of its
        last message. A message goes to the part its order key picks, else its publish
        key's, else the publish's turn: a key's messages always meet in one part."""
        partitions = self.store.partitions(topic)
        turn = next(self.store.turns) % partitions

        def part_of(i: int) -> int:
            order_key = order_keys[i] if order_keys else None
            if order_key:
                return key_part(order_key, partitions)
            return key_part(publish_keys[i], partitions) if publish_keys else turn
        by_part: dict[int, list[int]] = {}
        for i in range(len(bodies)):
            by_part.setdefault(part_of(i) if partitions > 1 else 0, []).append(i)
        ops = []
        for index, positions in by_part.items():
            for start in range(0, len(positions), KEYED_BODIES):
                chunk = positions[start:start + KEYED_BODIES]
                ops.append(self.store.publish_op(
                    topic, [bodies[i] for i in chunk], defer_ms, index=index,
                    publish_keys=publish_keys and [publish_keys[i] for i in chunk],
                    order_keys=order_keys and [order_keys[i] for i in chunk],
                    priorities=priorities and [priorities[i] for i in chunk]))
        return ops

    def publish_keyed(self, topic: str, bodies: Sequence[bytes],
                      publish_keys: Sequence[bytes] | None, defer_ms: int = 0,
                      order_keys: "Sequence[bytes | None] | None" = None,
                      priorities: Sequence[int] | None = None) -> int:
        """Publish with publish keys, order keys, priorities or some of them: the number
        of duplicates (not published)."""
        duplicates = 0
        for reply in self.store.run_many(self.keyed_publish_ops(
                topic, bodies, publish_keys, defer_ms, order_keys, priorities)):
            if isinstance(reply, Exception):
                raise reply
            duplicates += reply if publish_keys else 0
        return duplicates

