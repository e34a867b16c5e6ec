"""Ordered delivery by key (relay-admin order; lib/order.lua does the work in the
scripts). An ordered channel delivers the messages of one order key in publish order,
one at a time: the next goes out only once the one before is finished, dead-lettered,
expired or deleted. Different keys go out in parallel. A channel's mode is the meta
field `ordered` on every part, with the topic meta's count of ordered channels
(`ordered_channels`), so that publishing to a topic without one reads nothing more.

An order key is not a publish key (relay/store/dedup.py): that one makes a publish
idempotent, this one orders delivery; a message may carry both. A message gets its
order key from its publisher (/pub?key=, IDENTIFY relay_order), or else from its
topic's rule (`order_key` in part 0's version hash): a JSON field of the body, or the
text before a separator. Setting it is news (topic_rule.lua), so brokers learn it as they
learn a raised partition count (versions.lua), within a second. A key always goes to the part its hash picks, so its
order holds over partitions; raising the count moves keys (their order may break once).
The messages behind a key's wait numbered in the channel's msgs hash (data layout 3), or
on a channel made ordered under layout 2 in one sorted set (lib/order.lua says both)."""

import json
from typing import Iterator, NamedTuple, Sequence

from relay.codec import record_id
from relay.errors import StoreError
from relay.store import codes
from relay.store.data_path import Service
from relay.store.dedup import BadKeyedMessage, key_problem, keyed_messages
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.limits import OrderedAndLimited
from relay.store.runner import Op, guarded

ORDERED_FIELD = "ordered"
RULE_KINDS = ("json-field", "separator")
# a publish key's problems (relay/store/dedup.py), as an order key's are told
ORDER_KEY_CODES = {"ID_EMPTY": "KEY_EMPTY", "ID_TOO_LONG": "KEY_TOO_LONG",
                   "ID_NOT_TEXT": "KEY_NOT_TEXT"}
# the most waiting messages one call sends out when a channel's ordering is turned off:
# a call stays short, as every script call
RELEASE_STEP = 10_000
# the waiting messages read per Redis call (waiting_in)
WAIT_CHUNK = 1000
# the channel meta's fields of a gate whose waiting messages are numbered by key in the
# msgs hash, and their count (lib/order.lua)
SEQS_FIELD, WAITING_FIELD = "order_seqs", "order_waiting"


def order_key_problem(key: bytes) -> str | None:
    """Why `key` cannot be an order key, as an nsqd-style code (KEY_EMPTY, KEY_TOO_LONG,
    KEY_NOT_TEXT), or None: the same 1-256 bytes of text without spaces as a publish key."""
    problem = key_problem(key)
    return problem and ORDER_KEY_CODES[problem]


def split_keyed_forms(messages: list[bytes], publish_keys: bool, order_keys: bool
                      ) -> "tuple[list[bytes], list[bytes] | None, list[bytes | None] | None]":
    """(bodies, publish keys, order keys) of messages in the keyed body forms: "KEY BODY"
    with publish keys, "ORDERKEY BODY" with order keys, "KEY ORDERKEY BODY" with both
    (/mpub?keyed=true&ordered=true, MPUB keyed+ordered); BadKeyedMessage for the first
    that is not, its code KEY_* for an order key."""
    ids: list[bytes] | None = None
    found: "list[bytes | None] | None" = None
    if publish_keys:
        messages, ids = keyed_messages(messages)
    if order_keys:
        try:
            messages, keys = keyed_messages(messages)
        except BadKeyedMessage as e:
            raise BadKeyedMessage(e.number, ORDER_KEY_CODES.get(e.code, e.code)) from None
        found = list(keys)
    return messages, ids, found


class OrderKeyRule(NamedTuple):
    """How a topic reads the order key of a message published without one: `kind`
    json-field (the body is a JSON object, the key its field `value`: a string, or a
    number as written) or separator (the key is the text before the first `value`)."""

    kind: str
    value: str

    @classmethod
    def parse(cls, text: str) -> "OrderKeyRule | None":
        kind, _, value = text.partition(":")
        return cls(kind, value) if kind in RULE_KINDS and value else None

    def text(self) -> str:
        return f"{self.kind}:{self.value}"

    def key_of(self, body: bytes) -> bytes | None:
        """The body's order key by this rule, or None (no such field or separator, or
        what it gives is no valid key)."""
        if self.kind == "separator":
            key, separator, _ = body.partition(self.value.encode())
            if not separator:
                return None
        else:
            try:
                value = json.loads(body).get(self.value)
            except (ValueError, AttributeError):
                return None
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                return None
            key = str(value).encode()
        return None if key_problem(key) else key


class Waiting(NamedTuple):
    """A message waiting behind its order key: `element` is what remove.lua takes out
    (its field "<order key> <seq>" in msgs, or its ZSET member), `position` its place
    behind the key's message out (1: next)."""
    key: bytes
    id: bytes
    due_ms: int
    record: bytes
    element: bytes
    position: int

    @classmethod
    def of_entry(cls, key: bytes, field: bytes, entry: bytes, position: int) -> "Waiting":
        """One numbered in msgs: its field, and its entry there: the record, or
        "<due ms> <record>"."""
        due, record = (b"0", entry) if entry[0] >= 128 else entry.split(b" ", 1)
        return cls(key, record_id(record), int(due), record, field, position)

    @classmethod
    def of_member(cls, member: bytes, position: int) -> "Waiting":
        """One of a waiting ZSET's members: "<order key> <id> <due ms> <record>"."""
        key, msg_id, due, record = member.split(b" ", 3)
        return cls(key, msg_id, int(due), record, member, position)


def _zset_waiting(client, name: str) -> Iterator[Waiting]:
    """A waiting ZSET's members in order (keys in order, each key's in id order)."""
    start, key, position = 0, None, 0
    while members := guarded(client.zrange, name, start, start + WAIT_CHUNK - 1):
        for member in members:
            found = Waiting.of_member(member, 1)
            position = position + 1 if found.key == key else 1
            key = found.key
            yield found._replace(position=position)
        start += WAIT_CHUNK


class Ordering(Service):
    """Ordered channels, and the order keys of what is published."""

    def set_ordered(self, topic: str, channel: str, on: bool) -> int:
        """Turn the channel's ordered delivery on (making the channel if needed) or off:
        the messages waiting behind their keys that went out (turned off). Raises
        OrderedAndLimited for a channel with a depth limit."""
        if on:
            self.store.subscribe(topic, channel, "")      # /channel/create's way
        from relay.store import layout     # layout reads dead letters: not at import
        numbered = on and layout.writing(self.redis) >= layout.ORDER_SEQS
        released = 0
        for part in self.store.parts(topic, fresh=True):
            t, c = TopicKeys.of(part), ChannelKeys.of(part, channel)
            call_keys = [t.channels, t.meta, c.meta, c.queue, c.deferred, c.msgs, c.gate,
                         c.key_of, c.waiting, t.due, t.version, c.urgent]
            cursor = b"0"
            while True:
                reply = self.store.run(Op("ordered", call_keys, [
                    int(on), channel, t.wake, self.store.node(part), RELEASE_STEP,
                    int(numbered), cursor]))
                if int(reply[0]) == codes.LIMITED:
                    raise OrderedAndLimited(
                        f"channel {topic}/{channel} has a depth limit: remove it first "
                        "(relay-admin limit --off), ordered delivery and a depth limit do "
                        "not go together")
                released += int(reply[1]) if len(reply) > 1 else 0
                if len(reply) < 3 or not int(reply[2]):
                    break
                cursor = reply[3]
        return released

    def is_ordered(self, topic: str, channel: str) -> bool:
        """Whether the channel delivers in order (part 0's mode: every part has it)."""
        return bool(guarded(self.redis.hexists, ChannelKeys.of(topic, channel).meta,
                                ORDERED_FIELD))

    def ordered_channels(self, topic: str) -> int:
        """How many of the topic's channels are ordered (part 0's count)."""
        return int(guarded(self.redis.hget, TopicKeys.of(topic).meta,
                               "ordered_channels") or 0)

    def set_order_rule(self, topic: str, rule: OrderKeyRule | None) -> None:
        """The topic's rule for the order key of messages published without one (None:
        none); brokers use it within a second."""
        t = TopicKeys.of(topic)
        self.store.run(Op("topic_rule", [t.version], [
            "order_key", "" if rule is None else rule.text(), t.wake, self.store.node(topic)]))
        self.store.partitions(topic, fresh=True)

    def order_rule(self, topic: str) -> OrderKeyRule | None:
        """The topic's rule as last read with its partition count (which a publish reads
        again when stale, and a broker when the topic has news): a publish reads nothing
        more for it, but for a topic never read, whose count it reads first. A read that
        fails leaves no rule; the publish's own call then fails or lands, as publish_op's."""
        if not self.store.knows(topic):
            try:
                self.store.partitions(topic)
            except StoreError:
                pass
        return OrderKeyRule.parse(self.store.known_rule(topic))

    def order_keys(self, topic: str, bodies: Sequence[bytes],
                   given: "Sequence[bytes | None] | None" = None
                   ) -> "list[bytes | None] | None":
        """Each body's order key: the one given, else by the topic's rule; None when no
        body has one (a plain publish)."""
        if given is None and self.store.known_plain(topic):
            return None     # a known topic without a rule: the common case, at once
        rule = self.order_rule(topic)
        if given is None and rule is None:
            return None
        found: "list[bytes | None]" = list(given) if given is not None else [None] * len(bodies)
        if rule is not None:
            found = [key if key is not None else rule.key_of(body)
                     for key, body in zip(found, bodies)]
        return found if any(key is not None for key in found) else None

    def waiting_ids(self, topic: str, channel: str) -> set[bytes]:
        """The ids of the messages waiting behind their keys on every part of the
        channel: what an ordered channel's replay must not queue again
        (workers/operations.py)."""
        return {w.id for part in self.store.parts(topic) for w in self.waiting_in(part, channel)}

    def waiting_in(self, part: str, channel: str) -> Iterator[Waiting]:
        """The messages of one part of the channel waiting behind their order keys, keys
        in order and each key's in the order they go out, WAIT_CHUNK per Redis call:
        numbered in its msgs hash (lib/order.lua), or in its waiting ZSET."""
        c = ChannelKeys.of(part, channel)
        if guarded(self.redis.hget, c.meta, SEQS_FIELD) is None:
            yield from _zset_waiting(self.redis, c.waiting)
            return
        for key, value in sorted(guarded(self.redis.hgetall, c.gate).items()):
            _, *seqs = value.split(b" ")
            if not seqs:
                continue
            fields = [key + b" %d" % seq for seq in range(int(seqs[0]), int(seqs[1]))]
            position = 0
            for start in range(0, len(fields), WAIT_CHUNK):
                chunk = fields[start:start + WAIT_CHUNK]
                for field, entry in zip(chunk, guarded(self.redis.hmget, c.msgs, chunk)):
                    if entry is not None:       # None: deleted (relay-admin msg --delete)
                        position += 1
                        yield Waiting.of_entry(key, field, entry, position)

    def waiting_count(self, part: str, channel: str) -> int:
        """How many messages of one part of the channel wait behind their keys."""
        c = ChannelKeys.of(part, channel)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(c.waiting)
        pipe.hget(c.meta, WAITING_FIELD)
        in_set, numbered = guarded(pipe.execute)
        return in_set + int(numbered or 0)

    def order_report(self, topic: str, channel: str) -> dict:
        """Whether the channel is ordered, its keys with a message out and the messages
        waiting behind them, over its parts, and the topic's rule: what relay-admin
        order and /channel/order show."""
        pipe = self.redis.pipeline(transaction=False)
        parts = self.store.parts(topic)
        for part in parts:
            pipe.hlen(ChannelKeys.of(part, channel).gate)
        keys_out = sum(guarded(pipe.execute))
        rule = self.order_rule(topic)
        return {"topic": topic, "channel": channel,
                "ordered": self.is_ordered(topic, channel), "keys_out": keys_out,
                "waiting": sum(self.waiting_count(part, channel) for part in parts),
                "order_key_rule": rule and {"kind": rule.kind, "value": rule.value}}
