"""The Store: every change to queue state, as one Lua script call each, and the reads
of that state.

Methods come in pairs: `x_op(...)` builds an `Op` that the broker's group commit
batches with the work of other connections into one pipeline; `x(...)` runs it
alone. A ScriptRunner (relay/store/runner.py) sends the calls. A script that fans
out to a topic's channels and was given a stale list of them is sent again with
the real list (fanout.lua).
"""

import itertools
import secrets
import threading
import time
from typing import Callable, NamedTuple, Sequence

import redis

from relay.codec import is_ephemeral, make_record
from relay.errors import RelayError, StoreError
from relay.store import keys
from relay.store.keys import ChannelKeys, TopicKeys, id_part, part_name, split_part
from relay.store.runner import MAX_CALL_ARGS, Op, ScriptRunner, guarded, identity

REGISTER_EVERY = 10.0
# an MPUB of more messages is staged in a list first (publish.lua), as one call of them
# all would pass MAX_CALL_ARGS
INLINE_BODIES = MAX_CALL_ARGS // 2
STAGE_TTL_MS = 300_000
PARTITIONS_TTL = 1.0    # how long a topic's partition count is taken as read
# channel meta fields that are settings, not counts: a new part copies them
CHANNEL_COUNTS = {b"message_count", b"requeue_count", b"timeout_count", b"dead_count",
                  b"incarnation", b"empties"}


def replication(options, socket_timeout: int | None = None) -> dict:
    """Store arguments for --wait-replicas. WAIT gets half the connection's timeout
    (--redis-timeout unless given, ms), so the server answers before the connection
    gives up on the whole pipeline (FINs and all): Redis may end a WAIT up to 100 ms
    late (hz 10)."""
    timeout = socket_timeout or options.redis_timeout
    return {"wait_replicas": options.wait_replicas, "wait_timeout": max(1, timeout // 2)}
STALE = b"stale"


class PartitionsRefused(RelayError):
    """A topic's partition count only grows."""


class Dropped(NamedTuple):
    """What drop.lua took out: the topic's last message id at that moment (the cut:
    everything published later stays) and the trash keys that now hold it."""

    last_id: int
    trash: list

    @classmethod
    def parse(cls, reply) -> "Dropped | None":
        return None if reply is None else cls(reply[0], [k.decode() for k in reply[1:]])


class Subscribed(NamedTuple):
    """subscribe.lua's reply: whether the channel is new, and what a broker compares
    to see it deleted (a new incarnation each time it is created) or emptied."""

    created: bool
    incarnation: int
    empties: int

    @classmethod
    def parse(cls, reply) -> "Subscribed":
        return cls(bool(reply[0]), int(reply[1]), int(reply[2]))


class Delivered(list):
    """deliver.lua's reply: one list of records per group, the channel's count of
    empties when they were popped (`empties`), the codes of the FINs folded into
    the call (`finished`, as finish_op's), and whether the queue has more (`more`)."""

    empties: int = 0
    finished: list = []
    more: bool = False

    @classmethod
    def parse(cls, reply) -> "Delivered":
        delivered = cls(reply[:-3])
        delivered.empties = int(reply[-3])
        delivered.finished = reply[-2]
        delivered.more = bool(reply[-1])
        return delivered


class DueView(NamedTuple):
    now: int
    due: list
    more: bool
    failed: int


def _channel_keys(topic: str, channels) -> list:
    return [k for c in channels for k in ChannelKeys.of(topic, c).all()]


def _leave_keys(topic: str, channel: str) -> list:
    """The keys of a consumer leaving a channel (lib/leave.lua's layout)."""
    t, c = TopicKeys.of(topic), ChannelKeys.of(topic, channel)
    return [t.channels, t.meta, c.consumers, t.due, *(k for k in c.all() if k != c.consumers)]


def _staged(stage: str, bodies: Sequence[bytes]) -> tuple:
    """The commands that stage an MPUB's bodies in `stage` for its publish call: first
    emptied, so a call sent again stages them once; gone by itself if the call never
    comes (its broker died in between)."""
    step = MAX_CALL_ARGS - 2
    return (("DEL", stage),
            *(("RPUSH", stage, *bodies[i:i + step]) for i in range(0, len(bodies), step)),
            ("PEXPIRE", stage, STAGE_TTL_MS))


def _stale(raw) -> list | None:
    """The topic's real channels if a fan-out script was given a stale list."""
    if isinstance(raw, list) and raw[:1] == [STALE]:
        return sorted(c.decode() for c in raw[1:])
    return None


class Store:
    """Typed access to relay's state in one Redis database; `redis` is its client."""

    _guard = staticmethod(guarded)

    def __init__(self, client: redis.Redis, dedicated: bool = False, wait_replicas: int = 0,
                 wait_timeout: int = 0, topic_partitions: int = 1):
        """`dedicated`, `wait_replicas`, `wait_timeout`: see ScriptRunner;
        `topic_partitions`: the partition count of topics this Store creates."""
        self.redis = client
        self.runner = ScriptRunner(client, dedicated, wait_replicas, wait_timeout)
        self.cluster = self.runner.cluster
        self.topic_partitions = topic_partitions
        self._channels: dict[str, list] = {}
        self._registered: dict[str, float] = {}
        self._partitions: dict[str, tuple[int, float]] = {}
        self._reading: dict[str, threading.Lock] = {}   # one read per topic at a time
        # how the partition counts it caches are read: at once; a broker's go through
        # its group commit, so a burst of SUBs and PUBs to new topics is one pipeline
        self.lookup: Callable[[Op], object] = self.run
        # from a random part: short-lived publishers (a Spark task, relay-admin pub)
        # spread over the parts too
        self._turns = itertools.count(secrets.randbelow(keys.MAX_PARTITIONS))

    def sibling(self) -> "Store":
        """Another Store on the same client (a group-commit lane of its own) that shares
        what this one learned: channel lists, topic registrations, partition counts."""
        other = Store(self.redis, self.runner.dedicated, self.runner.wait_replicas,
                      self.runner.wait_timeout, self.topic_partitions)
        other._channels, other._registered = self._channels, self._registered
        other._partitions, other._turns = self._partitions, self._turns
        other._reading, other.lookup = self._reading, self.lookup
        return other

    def replication(self) -> dict:
        """This Store's wait for replicas, as Store(...) takes it."""
        return {"wait_replicas": self.runner.wait_replicas,
                "wait_timeout": self.runner.wait_timeout}

    def run(self, op: Op):
        return self.runner.run(op)

    def run_many(self, ops: Sequence[Op]) -> list:
        """Run ops in one pipeline; each result is a value or the exception for that op."""
        return self.runner.run_many(ops)

    # -- state transitions -------------------------------------------------

    def _fanout_op(self, script: str, topic: str, topic_keys: list, args: list,
                   parse: Callable = identity, pre: tuple = (), extra_keys: Callable = None,
                   channels: list | None = None) -> Op:
        """A call of a script that touches every channel of the topic (fanout.lua), with
        the channels this Store last saw; a stale reply sends it again with the real
        ones. `extra_keys(channels)` are declared between the topic's and the channels'."""
        if channels is None:
            channels = self._channels.get(topic, [])

        def redo(raw):
            real = _stale(raw)
            if real is None:
                return None
            self._channels[topic] = real
            return self._fanout_op(script, topic, topic_keys, args, parse, pre, extra_keys,
                                   real)

        extra = extra_keys(channels) if extra_keys else []
        return Op(script, [*topic_keys, *extra, *_channel_keys(topic, channels)],
                  [len(channels), *channels, *args], parse, pre, redo)

    # -- partitions ----------------------------------------------------------

    def partitions_op(self, topic: str, raise_to: int = 0) -> Op:
        """The topic's partition count, [now, before]; a new topic takes this Store's
        default, and `raise_to` raises it."""
        t = TopicKeys.of(topic)
        return Op("partitions", [t.version, t.meta], [self.topic_partitions, raise_to, t.wake],
                  lambda reply: [int(n) for n in reply])

    def partitions(self, topic: str, fresh: bool = False) -> int:
        """The topic's partition count, as read at most PARTITIONS_TTL ago unless `fresh`."""
        asked = time.monotonic()
        known = self._partitions.get(topic)
        if known and not fresh and asked - known[1] < PARTITIONS_TTL:
            return known[0]
        # the SUBs and PUBs of a burst that meet a new topic wait for one read of it
        with self._reading.setdefault(topic, threading.Lock()):
            known = self._partitions.get(topic)
            if known and known[1] >= asked:
                return known[0]
            count = self.lookup(self.partitions_op(topic))[0]
            self.learn_partitions(topic, count)
            return count

    def learn_partitions(self, topic: str, count: int) -> None:
        self._partitions[topic] = (count, time.monotonic())

    def parts(self, topic: str, fresh: bool = False) -> list[str]:
        """The names the topic's parts are stored under (keys.part_name)."""
        return keys.part_names(topic, self.partitions(topic, fresh))

    def set_partitions(self, topic: str, count: int) -> int:
        """Raise the topic's partition count to `count`; the new parts get the topic's
        channels and settings first, so no publish reaches a part without them. Lowering
        it raises PartitionsRefused. Returns the count before."""
        if not 1 <= count <= keys.MAX_PARTITIONS:
            raise PartitionsRefused(f"partitions must be 1-{keys.MAX_PARTITIONS}, not {count}")
        before = self.partitions(topic, fresh=True)
        if count < before:
            raise PartitionsRefused(f"topic {topic} has {before} partitions: the count can "
                                    f"only grow (asked for {count})")
        self._guard(self.redis.sadd, keys.TOPICS, topic)
        new = [part_name(topic, i) for i in range(before, count)]
        if new:
            self._prepare_parts(topic, new)
        now, before = self.run(self.partitions_op(topic, count))
        self.learn_partitions(topic, now)
        return before

    def _prepare_parts(self, topic: str, parts: list[str]) -> None:
        """Give new parts the topic's channels, their settings and the topic's pause."""
        self._guard(self.redis.sadd, keys.PARTITIONS, *parts)
        paused = self.read_topic(topic, parts=[topic])["paused"]
        for channel in self.channel_names(topic):
            settings = {k: v for k, v in self._guard(
                self.redis.hgetall, ChannelKeys.of(topic, channel).meta).items()
                if k not in CHANNEL_COUNTS}
            for part in parts:
                self.run(self.subscribe_op(part, channel, ""))
                if settings:
                    meta = ChannelKeys.of(part, channel).meta
                    self._guard(lambda: self.redis.hset(meta, mapping=settings))
        if paused:
            for part in parts:
                self.pause_topic(part, True, parts=[part])

    def publish_op(self, topic: str, bodies: Sequence[bytes], defer_ms: int = 0,
                   timestamp_ns: int | None = None, index: int | None = None) -> Op:
        """PUB/MPUB/DPUB to part `index` of the topic, else to its parts in turn (one
        call's messages stay together): returns the count of the last message. With
        the count unreadable it goes to part 0, which every topic has: the call itself
        then fails or lands."""
        try:
            count = self.partitions(topic)
        except StoreError:
            count = 1
        if index is None:
            index = next(self._turns) % count if count > 1 else 0
        part = part_name(topic, index)
        t = TopicKeys.of(part)
        ts = make_record(timestamp_ns or time.time_ns(), 0, b"", b"")[:8]
        topic_keys = [t.ids, t.meta, t.channels, t.backlog, t.backlog_deferred, t.due,
                      t.version]
        pre = self._register(topic, count)
        if len(bodies) <= INLINE_BODIES:
            return self._fanout_op("publish", part, topic_keys,
                                   [t.wake, ts, defer_ms, index, 0, *bodies], int, pre=pre)
        stage = keys.staging_key(part, secrets.token_hex(8))
        return self._fanout_op("publish", part, topic_keys,
                               [t.wake, ts, defer_ms, index, len(bodies)], int,
                               pre=pre + _staged(stage, bodies),
                               extra_keys=lambda channels: [stage])

    def _register(self, topic: str, partitions: int = 1) -> tuple:
        """SADD to the topic registry (and its parts to the parts') with a publish at most
        every REGISTER_EVERY seconds: it is one key, so on a cluster its node would get a
        command per publish. SUB always registers, so every topic a scanner must watch
        is there."""
        now = time.monotonic()
        if now - self._registered.get(topic, float("-inf")) < REGISTER_EVERY:
            return ()
        self._registered[topic] = now
        if partitions > 1:
            return (("SADD", keys.TOPICS, topic),
                    ("SADD", keys.PARTITIONS, *keys.part_names(topic, partitions)[1:]))
        return (("SADD", keys.TOPICS, topic),)

    def publish(self, topic, bodies, defer_ms=0, index=None):
        return self.run(self.publish_op(topic, bodies, defer_ms, index=index))

    def subscribe_op(self, part: str, channel: str, broker_id: str) -> Op:
        """SUB in one part: creates topic and channel as needed; returns a Subscribed."""
        t, c = TopicKeys.of(part), ChannelKeys.of(part, channel)
        topic, index = split_part(part)
        registry = ("SADD", keys.PARTITIONS, part) if index else ("SADD", keys.TOPICS, topic)
        return Op("subscribe",
                  [t.channels, t.backlog, t.backlog_deferred, c.queue, c.deferred, c.msgs,
                   c.meta, c.consumers, t.due, t.meta, t.version],
                  [channel, broker_id], Subscribed.parse, pre=(registry,))

    def subscribe(self, topic, channel, broker_id) -> bool:
        """SUB on every part: True if the channel is new."""
        joined = self.run_many([self.subscribe_op(part, channel, broker_id)
                                for part in self.parts(topic)])
        for reply in joined:
            if isinstance(reply, Exception):
                raise reply
        return joined[0].created

    def unsubscribe_op(self, topic: str, channel: str, broker_id: str,
                       channel_ephemeral: bool, topic_ephemeral: bool, incarnation: int) -> Op:
        """A consumer left: 0 kept, 1 ephemeral channel deleted, 2 topic deleted too."""
        return Op("unsubscribe", _leave_keys(topic, channel),
                  [channel, broker_id, int(channel_ephemeral), int(topic_ephemeral),
                   incarnation], int)

    def reap_op(self, part: str, channel: str, broker_id: str) -> Op:
        """A dead broker's share of a channel's part (workers/reaper.py): (0 kept,
        1 ephemeral channel deleted, 2 topic deleted too; in-flight messages requeued)."""
        topic = split_part(part)[0]
        return Op("reap", [*_leave_keys(part, channel), TopicKeys.of(part).version],
                  [channel, broker_id, int(is_ephemeral(channel)), int(is_ephemeral(topic)),
                   TopicKeys.of(part).wake], tuple)

    def create_topic(self, topic: str) -> bool:
        """/topic/create: a topic is its name in the registry (and its partition count,
        this Store's default) until something is published. True if it is new."""
        created = bool(self._guard(self.redis.sadd, keys.TOPICS, topic))
        count = self.partitions(topic, fresh=True)
        if count > 1:
            self._guard(self.redis.sadd, keys.PARTITIONS, *self.parts(topic)[1:])
        return created

    def create_channel(self, topic: str, channel: str) -> bool:
        """/channel/create: subscribe without a consumer."""
        return self.subscribe(topic, channel, "")

    def pause_topic(self, topic: str, paused: bool, parts: list | None = None) -> None:
        for part in parts or self.parts(topic):
            t = TopicKeys.of(part)
            self.run(self._fanout_op("pause_topic", part,
                                     [t.meta, t.channels, t.backlog, t.backlog_deferred, t.due,
                                      t.version],
                                     ["1" if paused else "0", t.wake]))

    def pause_channel(self, topic: str, channel: str, paused: bool) -> None:
        for part in self.parts(topic):
            c, t = ChannelKeys.of(part, channel), TopicKeys.of(part)
            self.run(Op("pause_channel", [c.meta, t.version],
                        ["1" if paused else "0", t.wake, channel]))

    def drop_op(self, topic: str, channel: str = "", delete: bool = False) -> Op:
        """Empty or delete a channel, or with channel "" the topic (drop.lua): its
        messages move to new trash keys in this one call. Returns a Dropped, or None
        when the channel to delete does not exist."""
        t = TopicKeys.of(topic)
        trash = keys.trash_prefix(topic, secrets.token_hex(8))
        per_channel = len(keys.MESSAGE_SUFFIXES)

        def trash_keys(channels):
            return [f"{trash}{i}" for i in range(1, 3 + per_channel * len(channels))]

        return self._fanout_op(
            "drop", topic,
            [t.ids, t.channels, t.meta, t.backlog, t.backlog_deferred, t.due, t.version],
            [channel, int(delete), t.wake], Dropped.parse, extra_keys=trash_keys,
            channels=[channel] if channel else (None if delete else []))

    def detach(self, topic: str, channel: str = "", delete: bool = False) -> "Dropped | None":
        """drop_op on every part, and a deleted topic leaves the topic registry; None if
        not found. The cut is part 0's; the trash is every part's."""
        if delete and not channel and not self._guard(self.redis.sismember, keys.TOPICS, topic):
            return None
        dropped = [self.run(self.drop_op(part, channel, delete))
                   for part in self.parts(topic, fresh=True)]
        if delete and not channel:
            self.forget_topic(topic)
        if dropped[0] is None:
            return None
        return Dropped(dropped[0].last_id, [k for d in dropped if d for k in d.trash])

    def drop(self, topic: str, channel: str = "", delete: bool = False) -> "Dropped | None":
        """detach, then free the trash at once: UNLINK frees it off Redis' main thread."""
        dropped = self.detach(topic, channel, delete)
        if dropped is not None and dropped.trash:
            self._guard(self.redis.unlink, *dropped.trash)
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
        self._registered.pop(topic, None)
        self.redis.srem(keys.TOPICS, topic)
        parts = self.parts(topic)[1:]
        if parts:
            self.redis.srem(keys.PARTITIONS, *parts)

    def deliver_op(self, part: str, channel: str, groups: Sequence[tuple],
                   max_attempts: int = 0) -> Op:
        """Pop from one part for each (owner, timeout ms, count[, most bytes]): a
        Delivered, one list of records per group. Messages delivered `max_attempts` times
        already (0: no limit; the channel's own setting wins) go to its dead-letter outbox
        instead."""
        c = ChannelKeys.of(part, channel)
        args = [channel, max_attempts, 0]
        for owner, timeout_ms, count, *most_bytes in groups:
            args += [owner, timeout_ms, count, most_bytes[0] if most_bytes else 0]
        return Op("deliver", [c.queue, c.inflight, c.msgs, c.leases, TopicKeys.of(part).due,
                              c.meta, c.dead], args, Delivered.parse)

    def deliver(self, topic: str, channel: str, groups: Sequence[tuple],
                max_attempts: int = 0) -> list:
        """deliver_op over the topic's parts, starting at the next in turn, until each
        group has its count or every part was asked: one list of records per group."""
        parts = self.parts(topic)
        if len(parts) == 1:
            return self.run(self.deliver_op(topic, channel, groups, max_attempts))
        first = next(self._turns)
        wanted = [count for _, _, count in groups]
        got: list[list] = [[] for _ in groups]
        for turn in range(len(parts)):
            short = [i for i, n in enumerate(wanted) if len(got[i]) < n]
            if not short:
                break
            part = parts[(first + turn) % len(parts)]
            reply = self.run(self.deliver_op(
                part, channel,
                [(*groups[i][:2], wanted[i] - len(got[i]), *groups[i][3:]) for i in short],
                max_attempts))
            for i, records in zip(short, reply):
                got[i].extend(records)
        return got

    @staticmethod
    def finishing_first(deliver: Op, finish: Op) -> Op:
        """A deliver call of the same channel that also does a finish call's work first:
        the group commit folds FINs into the deliver that follows them."""
        args = deliver.args
        pairs = int(args[2])
        return deliver._replace(args=[*args[:2], pairs + len(finish.args) // 2,
                                      *args[3:3 + 2 * pairs], *finish.args,
                                      *args[3 + 2 * pairs:]])

    def finish_op(self, part: str, channel: str, pairs: Sequence[tuple]) -> Op:
        """FIN each (owner, id) of one part: per pair 1 done, 0 not in flight, -1 owned
        by another."""
        c = ChannelKeys.of(part, channel)
        return Op("finish", [c.inflight, c.msgs, c.leases], [x for p in pairs for x in p])

    def finish(self, topic, channel, pairs):
        return self._by_part(self.finish_op, topic, channel, pairs)

    def _by_part(self, make_op: Callable, topic: str, channel: str,
                 items: Sequence[tuple], *shared) -> list:
        """make_op(part, channel, *shared, items) for the items of each part (by the
        part their id, item[1], names), in one pipeline: the codes in items' order."""
        return self.run_by_part(self.by_part(make_op, topic, channel, items, *shared))

    @staticmethod
    def by_part(make_op: Callable, topic: str, channel: str, items: Sequence[tuple],
                *shared) -> list[tuple[Op, list]]:
        """(op, positions of its items) for each part the items' ids name."""
        positions: dict[int, list] = {}
        for i, item in enumerate(items):
            positions.setdefault(max(id_part(item[1]), 0), []).append(i)
        return [(make_op(part_name(topic, index), channel, *shared, [items[i] for i in where]),
                 where) for index, where in positions.items()]

    def run_by_part(self, calls: list[tuple[Op, list]]) -> list:
        codes = [0] * sum(len(where) for _, where in calls)
        for (_, where), reply in zip(calls, self.run_many([op for op, _ in calls])):
            if isinstance(reply, Exception):
                raise reply
            for i, code in zip(where, reply):
                codes[i] = code
        return codes

    def requeue_op(self, part: str, channel: str, triples: Sequence[tuple]) -> Op:
        """REQ each (owner, id, delay ms) of one part: per triple 1 done, 0 / -1 as finish."""
        t, c = TopicKeys.of(part), ChannelKeys.of(part, channel)
        return Op("requeue",
                  [c.queue, c.inflight, c.msgs, c.leases, c.deferred, c.meta, t.due,
                   t.version],
                  [channel, t.wake, *(x for tr in triples for x in tr)])

    def requeue(self, topic, channel, triples):
        return self._by_part(self.requeue_op, topic, channel, triples)

    def requeue_in_flight(self, topic: str, channel: str, ids: Sequence[bytes],
                          delivered_by_ms: int | None = None) -> list[int]:
        """Admin requeue: in-flight messages go back to the queue whoever holds them
        (their holder's FIN then fails, as after a timeout). With `delivered_by_ms`,
        only those delivered by then. Per id: 1 requeued, else 0."""
        pipe = self.redis.pipeline(transaction=False)
        for msg_id in ids:
            pipe.hget(ChannelKeys.of(part_name(topic, max(id_part(msg_id), 0)), channel).leases,
                      msg_id)
        leases = self._guard(pipe.execute)
        triples = []
        for msg_id, lease in zip(ids, leases):
            if lease is None:
                continue
            delivered, _, owner = lease.partition(b" ")
            if delivered_by_ms is None or int(delivered) <= delivered_by_ms:
                triples.append((owner, msg_id, 0))
        done = self.requeue(topic, channel, triples) if triples else []
        requeued = {msg_id for (_, msg_id, _), r in zip(triples, done) if r == 1}
        return [int(msg_id in requeued) for msg_id in ids]

    def touch_op(self, part: str, channel: str, max_msg_timeout_ms: int,
                 triples: Sequence[tuple]) -> Op:
        """TOUCH each (owner, id, timeout ms) of one part: per triple the new deadline ms,
        or 0 / -1."""
        c = ChannelKeys.of(part, channel)
        return Op("touch", [c.inflight, c.leases],
                  [max_msg_timeout_ms, *(x for tr in triples for x in tr)])

    def touch(self, topic, channel, max_msg_timeout_ms, triples):
        return self._by_part(self.touch_op, topic, channel, triples, max_msg_timeout_ms)

    def scan_op(self, topic: str, channel: str, limit: int) -> Op:
        """Requeue expired and due messages: (timed out, promoted, next due ms or -1,
        messages waiting in the dead-letter outbox)."""
        t, c = TopicKeys.of(topic), ChannelKeys.of(topic, channel)
        return Op("scan",
                  [c.queue, c.inflight, c.msgs, c.leases, c.deferred, c.meta, t.due, c.dead,
                   t.version],
                  [channel, t.wake, limit], tuple)

    def scan(self, topic, channel, limit=1000):
        return self.run(self.scan_op(topic, channel, limit))

    def configure_channel(self, topic: str, channel: str, name: str, value) -> None:
        """Set (or with None, clear) a channel setting kept in its meta hash, on every
        part (read from part 0)."""
        for part in self.parts(topic):
            meta = ChannelKeys.of(part, channel).meta
            if value is None:
                self._guard(self.redis.hdel, meta, name)
            else:
                self._guard(self.redis.hset, meta, name, value)

    def channel_setting(self, topic: str, channel: str, name: str) -> str | None:
        value = self._guard(self.redis.hget, ChannelKeys.of(topic, channel).meta, name)
        return value.decode() if value is not None else None

    def queued_records(self, topic: str, channel: str, chunk: int):
        """The channel's ready queues, `chunk` records at a time, without taking them."""
        for part in self.parts(topic):
            queue, start = ChannelKeys.of(part, channel).queue, 0
            while records := self._guard(self.redis.lrange, queue, start, start + chunk - 1):
                yield records
                start += chunk

    # -- reads ---------------------------------------------------------------

    def due_channels(self, topics: Sequence[str], per_topic: int,
                     now: int | None = None) -> "DueView":
        """The (topic, channel, due ms) entries of the topics' due indexes due by Redis
        time `now` (ms, read if None), and whether some topic may have more: one due.lua
        call per node (per slot on a cluster without script flags, Redis 6.2). The
        topics of a call that failed (a slot moving) are left for the next pass."""
        now = self.now_ms() if now is None else now  # a cluster pipeline takes no TIME
        groups = self._node_groups(topics)
        ops = []
        for group in groups:
            indexes = [TopicKeys.of(t).due for t in group]
            ops.append(Op("due", indexes[:1], [now, per_topic, *indexes]))
        due, more, failed = [], False, 0
        for group, reply in zip(groups, self.run_many(ops)):
            if isinstance(reply, Exception):
                failed += 1
                continue
            counts: dict = {}
            for i in range(0, len(reply), 3):
                topic = group[reply[i] - 1]
                due.append((topic, reply[i + 1].decode(), int(reply[i + 2])))
                counts[topic] = counts.get(topic, 0) + 1
            more = more or any(n == per_topic for n in counts.values())
        if failed and self.cluster:
            self.runner.refresh_slots()
        return DueView(now, due, more, failed)

    def versions(self, topics: Sequence[str]) -> dict:
        """topic (or part) -> its version (news.lua; 0 while it has none) for those read:
        one versions.lua call per node (per slot on Redis 6.2); the partition counts read
        with them are learned. The topics of a call that failed are left out, for the
        next read."""
        groups = self._node_groups(topics)
        ops = []
        for group in groups:
            version_keys = [TopicKeys.of(t).version for t in group]
            ops.append(Op("versions", version_keys[:1], version_keys))
        read: dict = {}
        for group, reply in zip(groups, self.run_many(ops)):
            if isinstance(reply, Exception):
                if self.cluster:
                    self.runner.refresh_slots()
                continue
            for topic, news, partitions in zip(group, reply[::2], reply[1::2]):
                read[topic] = int(news or 0)
                if keys.PART_MARK not in topic:
                    self.learn_partitions(topic, int(partitions or 1))
        return read

    def channel_states(self, channels: Sequence[tuple]) -> list:
        """(incarnation or None if the channel is gone, empties) of each (topic, channel):
        what subscribe.lua returned, as it is now."""
        pipe = self.redis.pipeline(transaction=False)
        for topic, channel in channels:
            pipe.hmget(ChannelKeys.of(topic, channel).meta, "incarnation", "empties")
        return [(int(i) if i is not None else None, int(e or 0))
                for i, e in self._guard(pipe.execute)]

    def _node_groups(self, topics: Sequence[str]) -> list[list]:
        """The topics by the node that serves them (all in one on a single server)."""
        if not self.cluster:
            return [list(topics)] if topics else []
        groups: dict = {}
        for topic in topics:
            groups.setdefault(self.runner.node_group(TopicKeys.of(topic).due), []).append(topic)
        return list(groups.values())

    def now_ms(self) -> int:
        """Redis' clock, the one every script uses."""
        sec, usec = self._guard(self.redis.time)
        return sec * 1000 + usec // 1000

    def topic_names(self) -> list[str]:
        return sorted(n.decode() for n in self._guard(self.redis.smembers, keys.TOPICS))

    def stored_parts(self) -> list[str]:
        """The parts of every registered topic (a topic of one partition is its own):
        what scanners and reapers walk."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.smembers(keys.TOPICS)
        pipe.smembers(keys.PARTITIONS)
        topics, parts = self._guard(pipe.execute)
        return sorted(n.decode() for n in topics | parts)

    def channel_names(self, topic: str) -> list[str]:
        names = self._guard(self.redis.smembers, TopicKeys.of(topic).channels)
        return sorted(n.decode() for n in names)

    def consumer_brokers(self, topics: Sequence[str]) -> set[str]:
        """The broker ids counted among the consumers of the topics' channels."""
        pipe = self.redis.pipeline(transaction=False)
        for topic in topics:
            pipe.smembers(TopicKeys.of(topic).channels)
        channels = [(t, c.decode()) for t, names in zip(topics, self._guard(pipe.execute))
                    for c in names]
        for topic, channel in channels:
            pipe.hkeys(ChannelKeys.of(topic, channel).consumers)
        return {b.decode() for ids in self._guard(pipe.execute) for b in ids}

    def read_topic(self, topic: str, parts: list | None = None) -> dict:
        """Depth and counters of a topic as stored, summed over its parts (or `parts`);
        paused as part 0 is."""
        return summed(self.read_topic_parts(topic, parts))

    def read_topic_parts(self, topic: str, parts: list | None = None) -> list[dict]:
        parts = parts or self.parts(topic)
        pipe = self.redis.pipeline(transaction=False)
        for part in parts:
            t = TopicKeys.of(part)
            pipe.hgetall(t.meta)
            pipe.llen(t.backlog)
            pipe.zcard(t.backlog_deferred)
        replies = self._guard(pipe.execute)
        return [{"message_count": int(meta.get(b"message_count", 0)),
                 "message_bytes": int(meta.get(b"message_bytes", 0)),
                 "depth": backlog, "deferred_count": deferred, "paused": b"paused" in meta}
                for meta, backlog, deferred in zip(*[iter(replies)] * 3)]

    def read_channel(self, topic: str, channel: str) -> dict:
        """Depth, in-flight, deferred and counters of a channel as stored, summed over
        the topic's parts; consumers and paused as part 0 has them (every part counts
        the same consumers)."""
        return summed(self.read_channel_parts(topic, channel))

    def read_channel_parts(self, topic: str, channel: str) -> list[dict]:
        """read_channel of each part."""
        pipe = self.redis.pipeline(transaction=False)
        for part in self.parts(topic):
            c = ChannelKeys.of(part, channel)
            pipe.llen(c.queue)
            pipe.zcard(c.inflight)
            pipe.zcard(c.deferred)
            pipe.hgetall(c.meta)
            pipe.hvals(c.consumers)
        replies = self._guard(pipe.execute)
        return [{"depth": depth, "in_flight_count": inflight, "deferred_count": deferred,
                 "message_count": int(meta.get(b"message_count", 0)),
                 "requeue_count": int(meta.get(b"requeue_count", 0)),
                 "timeout_count": int(meta.get(b"timeout_count", 0)),
                 "dead_count": int(meta.get(b"dead_count", 0)),
                 "client_count": sum(int(v) for v in consumers), "paused": b"paused" in meta}
                for depth, inflight, deferred, meta, consumers in zip(*[iter(replies)] * 5)]


# read as part 0 has them, not summed
FIRST_PART_ONLY = ("paused", "client_count")


def summed(parts: list[dict]) -> dict:
    """One dict of the parts' counts: summed, but FIRST_PART_ONLY as part 0's."""
    total = dict(parts[0])
    for part in parts[1:]:
        for name, value in part.items():
            if name not in FIRST_PART_ONLY:
                total[name] += value
    return total
