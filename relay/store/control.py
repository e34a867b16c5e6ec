"""The Store's control of topics and channels, used by brokers' HTTP API, relay-admin
and the jobs worker: create, partition, pause, empty and delete, channel settings,
message TTLs (expiry.py) and the admin requeue of in-flight messages."""

import secrets
from typing import Iterator, Sequence

from relay.errors import RelayError
from relay.store import codes, keys
from relay.store.dedup import DEDUP_FIELD
from relay.store.data_path import DataPath, Service
from relay.store.expiry import CHANNEL_TTL_FIELD
from relay.store.history import RETENTION_FIELDS
from relay.store.inflight import expand, member_id, member_item, member_owner
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.limits import LIMIT_FIELDS, RATE_BUCKET, Limits
from relay.store.reads import Reads
from relay.store.replies import Dropped
from relay.store.runner import Op, guarded

# channel meta fields that are settings, not counts: a new part copies them
CHANNEL_COUNTS = {b"message_count", b"requeue_count", b"timeout_count", b"dead_count",
                  b"deleted_count", b"expired_count", b"overflow_count", b"incarnation",
                  b"empties", b"order_waiting", b"lotted"}
# topic meta fields that are settings: a new part copies them (ttl_ms, channel_ttl:
# ttl.lua)
TOPIC_SETTINGS = (*RETENTION_FIELDS, "ttl_ms", CHANNEL_TTL_FIELD, DEDUP_FIELD)


class PartitionsRefused(RelayError):
    """A topic's partition count only grows."""


class Control(Service):
    """Changes made by people and their tools, not by the flow of messages."""

    def __init__(self, store: DataPath, reads: Reads, limits: Limits) -> None:
        super().__init__(store)
        self.reads, self.limits = reads, limits

    def set_partitions(self, topic: str, count: int) -> int:
        """Raise the topic's partition count to `count`; the new parts get the topic's
        channels and settings first, so no publish reaches a part without them. Lowering
        it raises PartitionsRefused. Returns the count before."""
        if not 1 <= count <= keys.MAX_PARTITIONS:
            raise PartitionsRefused(f"partitions must be 1-{keys.MAX_PARTITIONS}, not {count}")
        before = self.store.partitions(topic, fresh=True)
        if count < before:
            raise PartitionsRefused(f"topic {topic} has {before} partitions: the count can "
                                    f"only grow (asked for {count})")
        guarded(self.redis.sadd, keys.TOPICS, topic)
        salts = self.store.placement(topic, count)
        new = keys.part_names(topic, count, salts)[before:]
        if new:
            self._prepare_parts(topic, new)
        now, before, _, salts, *_ = self.store.run(self.store.partitions_op(topic, count, salts))
        self.store.learn_partitions(topic, now, salts)
        for channel in self.reads.channel_names(topic) if new else ():
            limit = self.limits.limit(topic, channel)
            if limit:       # each part's share shrinks; the new parts get theirs
                self.limits.set_limit(topic, channel, limit)
        return before

    def _prepare_parts(self, topic: str, parts: list[str]) -> None:
        """Give new parts the topic's settings (retention, TTL, dedup window), channels,
        their settings and the topic's pause."""
        guarded(self.redis.sadd, keys.PARTITIONS, *parts)
        settings = guarded(self.redis.hmget, TopicKeys.of(topic).meta, *TOPIC_SETTINGS)
        for name, value in zip(TOPIC_SETTINGS, settings):
            for part in parts:
                if value is not None:
                    guarded(self.redis.hset, TopicKeys.of(part).meta, name, value)
        # paused for good, not an unpause under way (pause_topic.lua's steps): the new
        # parts have no backlog to hand over, and their pause would stay
        paused = guarded(self.redis.hget, TopicKeys.of(topic).meta, "paused") not in (
            None, keys.UNPAUSING)
        for channel in self.reads.channel_names(topic):
            settings = {k: v for k, v in guarded(
                self.redis.hgetall, ChannelKeys.of(topic, channel).meta).items()
                if k not in CHANNEL_COUNTS and k not in LIMIT_FIELDS and k != RATE_BUCKET}
            for part in parts:
                self.store.run(self.store.subscribe_op(part, channel, ""))
                if settings:
                    meta = ChannelKeys.of(part, channel).meta
                    guarded(lambda: self.redis.hset(meta, mapping=settings))
        if paused:
            for part in parts:
                self.pause_topic(part, True, parts=[part])

    def create_topic(self, topic: str) -> bool:
        """/topic/create: a topic is its name in the registry (and its partition count,
        this Store's default) until something is published. True if it is new."""
        created = bool(guarded(self.redis.sadd, keys.TOPICS, topic))
        count = self.store.partitions(topic, fresh=True)
        if count > 1:
            guarded(self.redis.sadd, keys.PARTITIONS, *self.store.parts(topic)[1:])
        return created

    def create_channel(self, topic: str, channel: str) -> bool:
        """/channel/create: subscribe without a consumer."""
        return self.store.subscribe(topic, channel, "")

    def pause_topic(self, topic: str, paused: bool, parts: list | None = None) -> None:
        """Pause or unpause each part; an unpause moves the backlog in calls of a
        bounded size (pause_topic.lua), as many as it takes."""
        for part in parts or self.store.parts(topic):
            op = self.store.pause_topic_op(part, "1" if paused else "0")
            if self.store.run(op) == codes.MORE:
                self.store.hand_over(part)

    def pause_channel(self, topic: str, channel: str, paused: bool) -> None:
        for part in self.store.parts(topic):
            c, t = ChannelKeys.of(part, channel), TopicKeys.of(part)
            self.store.run(Op("pause_channel", [c.meta, t.version],
                        ["1" if paused else "0", t.wake, channel, self.store.node(part)]))

    def drop_op(self, topic: str, channel: str = "", delete: bool = False) -> Op:
        """Empty or delete a channel, or with channel "" the topic (drop.lua): its
        messages move to new trash keys in this one call. Returns a Dropped, or None
        when the channel to delete does not exist."""
        t = TopicKeys.of(topic)
        return self.store.fanout_op(
            "drop", topic,
            [t.ids, t.channels, t.meta, t.backlog, t.backlog_deferred, t.due, t.version,
             t.history],
            [channel, int(delete), t.wake, self.store.node(topic)], Dropped.parse,
            channels=[channel] if channel else (None if delete else []),
            trash=keys.trash_prefix(topic, secrets.token_hex(8)))

    def detach(self, topic: str, channel: str = "", delete: bool = False) -> "Dropped | None":
        """drop_op on every part, and a deleted topic leaves the topic registry; None if
        not found. The cut is part 0's; the trash is every part's."""
        if delete and not channel and not guarded(self.redis.sismember, keys.TOPICS, topic):
            return None
        dropped = [self.store.run(self.drop_op(part, channel, delete))
                   for part in self.store.parts(topic, fresh=True)]
        if delete and not channel:
            self.forget_topic(topic)
        if dropped[0] is None:
            return None
        return Dropped(dropped[0].last_id, [k for d in dropped if d for k in d.trash])

    def drop(self, topic: str, channel: str = "", delete: bool = False) -> "Dropped | None":
        """detach, then free the trash at once: UNLINK frees it off Redis' main thread."""
        dropped = self.detach(topic, channel, delete)
        if dropped is not None and dropped.trash:
            guarded(self.redis.unlink, *dropped.trash)
        return dropped

    def empty_channel(self, topic: str, channel: str) -> None:
        self.drop(topic, channel)

    def empty_topic(self, topic: str) -> None:
        """Drop the topic backlog; channels keep their messages (nsqd's Topic.Empty)."""
        self.drop(topic)

    def delete_channel(self, topic: str, channel: str) -> bool:
        """False if the channel did not exist."""
        return self.drop(topic, channel, delete=True) is not None

    def delete_topic(self, topic: str) -> bool:
        """False if the topic did not exist; its channels go with it."""
        return self.drop(topic, delete=True) is not None

    def forget_topic(self, topic: str) -> None:
        self.store.forget_registered(topic)
        self.redis.srem(keys.TOPICS, topic)
        parts = self.store.parts(topic)[1:]
        if parts:
            self.redis.srem(keys.PARTITIONS, *parts)

    def requeue_in_flight(self, topic: str, channel: str, ids: Sequence[bytes]) -> list[int]:
        """Admin requeue of ids: each goes back to the queue whoever holds it (its
        holder's FIN then fails, as after a timeout). Only the in-flight member names the
        holder, so this reads the channel's in-flight set once through (ZSCAN), as an
        operator's command may. Per id: 1 requeued, else 0."""
        wanted = set(ids)
        held: dict[bytes, bytes] = {}
        for entries in self.in_flight_entries(topic, channel):
            held.update((member_id(m), m) for m, _ in entries if member_id(m) in wanted)
        done = dict(zip(held, self.requeue_held(topic, channel, list(held.values()))))
        return [done.get(msg_id, 0) for msg_id in ids]

    def in_flight_entries(self, topic: str, channel: str,
                          count: int = 1000) -> Iterator[list[tuple[bytes, float]]]:
        """The in-flight members of every part with their deadlines, about `count` per
        Redis call (ZSCAN: an entry may come twice, and those that come or go meanwhile
        may be missed); a lot's messages each as its member (inflight.expand)."""
        for part in self.store.parts(topic):
            c, cursor = ChannelKeys.of(part, channel), None
            key, msgs = c.inflight, c.msgs
            while cursor != 0:
                cursor, entries = guarded(
                    lambda: self.redis.zscan(key, cursor or 0, count=count))
                if entries:
                    yield [(m, d) for m, d, _ in expand(self.redis, msgs, entries)]

    def requeue_held(self, topic: str, channel: str, members: Sequence[bytes]) -> list[int]:
        """Requeue in-flight messages by their members, each from the owner it names
        (lib/inflight.lua). Per member: 1 requeued, 0 no longer held so."""
        triples = [(member_owner(m), member_item(m), 0) for m in members]
        return [int(code == codes.DONE) for code in (self.store.requeue(topic, channel, triples)
                                                     if triples else [])]

    def configure_channel(self, topic: str, channel: str, name: str, value) -> None:
        """Set (or with None, clear) a channel setting kept in its meta hash, on every
        part (read from part 0)."""
        for part in self.store.parts(topic):
            meta = ChannelKeys.of(part, channel).meta
            if value is None:
                guarded(self.redis.hdel, meta, name)
            else:
                guarded(self.redis.hset, meta, name, value)
