"""The Store: every change to queue state, as one Lua script call each, and the reads
of that state.

Methods come in pairs: `x_op(...)` builds an `Op` that the broker's group commit
batches with the work of other connections into one pipeline; `x(...)` runs it
alone. A ScriptRunner (relay/store/runner.py) sends the calls. A script that fans
out to a topic's channels and was given a stale list of them is sent again with
the real list (fanout.lua).
"""

import secrets
import time
from typing import Callable, NamedTuple, Sequence

import redis

from relay.codec import is_ephemeral, make_record
from relay.store import keys
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.runner import Op, ScriptRunner, guarded, identity

REGISTER_EVERY = 10.0


def replication(options, socket_timeout: int | None = None) -> dict:
    """Store arguments for --wait-replicas. WAIT gets half the connection's timeout
    (--redis-timeout unless given, ms), so the server answers before the connection
    gives up on the whole pipeline (FINs and all): Redis may end a WAIT up to 100 ms
    late (hz 10)."""
    timeout = socket_timeout or options.redis_timeout
    return {"wait_replicas": options.wait_replicas, "wait_timeout": max(1, timeout // 2)}
STALE = b"stale"


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
    empties when they were popped (`empties`), and the codes of the FINs folded into
    the call (`finished`, as finish_op's)."""

    empties: int = 0
    finished: list = []

    @classmethod
    def parse(cls, reply) -> "Delivered":
        delivered = cls(reply[:-2])
        delivered.empties = int(reply[-2])
        delivered.finished = reply[-1]
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


def _stale(raw) -> list | None:
    """The topic's real channels if a fan-out script was given a stale list."""
    if isinstance(raw, list) and raw[:1] == [STALE]:
        return sorted(c.decode() for c in raw[1:])
    return None


class Store:
    """Typed access to relay's state in one Redis database; `redis` is its client."""

    _guard = staticmethod(guarded)

    def __init__(self, client: redis.Redis, dedicated: bool = False, wait_replicas: int = 0,
                 wait_timeout: int = 0):
        """`dedicated`, `wait_replicas`, `wait_timeout`: see ScriptRunner."""
        self.redis = client
        self.runner = ScriptRunner(client, dedicated, wait_replicas, wait_timeout)
        self.cluster = self.runner.cluster
        self._channels: dict[str, list] = {}
        self._registered: dict[str, float] = {}

    def sibling(self) -> "Store":
        """Another Store on the same client (a group-commit lane of its own) that shares
        what this one learned: channel lists and topic registrations."""
        other = Store(self.redis, self.runner.dedicated, self.runner.wait_replicas,
                      self.runner.wait_timeout)
        other._channels, other._registered = self._channels, self._registered
        return other

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

    def publish_op(self, topic: str, bodies: Sequence[bytes], defer_ms: int = 0,
                   timestamp_ns: int | None = None) -> Op:
        """PUB/MPUB/DPUB: returns the number of the last message id."""
        t = TopicKeys.of(topic)
        ts = make_record(timestamp_ns or time.time_ns(), 0, b"", b"")[:8]
        return self._fanout_op(
            "publish", topic,
            [t.ids, t.meta, t.channels, t.backlog, t.backlog_deferred, t.due, t.version],
            [t.wake, ts, defer_ms, *bodies], int, pre=self._register(topic))

    def _register(self, topic: str) -> tuple:
        """SADD to the topic registry with a publish at most every REGISTER_EVERY seconds:
        it is one key, so on a cluster its node would get a command per publish. SUB
        always registers, so every topic a scanner must watch is there."""
        now = time.monotonic()
        if now - self._registered.get(topic, float("-inf")) < REGISTER_EVERY:
            return ()
        self._registered[topic] = now
        return (("SADD", keys.TOPICS, topic),)

    def publish(self, topic, bodies, defer_ms=0):
        return self.run(self.publish_op(topic, bodies, defer_ms))

    def subscribe_op(self, topic: str, channel: str, broker_id: str) -> Op:
        """SUB: creates topic and channel as needed; returns a Subscribed."""
        t, c = TopicKeys.of(topic), ChannelKeys.of(topic, channel)
        return Op("subscribe",
                  [t.channels, t.backlog, t.backlog_deferred, c.queue, c.deferred, c.msgs,
                   c.meta, c.consumers, t.due, t.meta, t.version],
                  [channel, broker_id], Subscribed.parse,
                  pre=(("SADD", keys.TOPICS, topic),))

    def subscribe(self, topic, channel, broker_id) -> bool:
        """True if the channel is new."""
        return self.run(self.subscribe_op(topic, channel, broker_id)).created

    def unsubscribe_op(self, topic: str, channel: str, broker_id: str,
                       channel_ephemeral: bool, topic_ephemeral: bool, incarnation: int) -> Op:
        """A consumer left: 0 kept, 1 ephemeral channel deleted, 2 topic deleted too."""
        return Op("unsubscribe", _leave_keys(topic, channel),
                  [channel, broker_id, int(channel_ephemeral), int(topic_ephemeral),
                   incarnation], int)

    def reap_op(self, topic: str, channel: str, broker_id: str) -> Op:
        """A dead broker's part of a channel (relay/reaper.py): (0 kept, 1 ephemeral
        channel deleted, 2 topic deleted too; in-flight messages requeued)."""
        return Op("reap", [*_leave_keys(topic, channel), TopicKeys.of(topic).version],
                  [channel, broker_id, int(is_ephemeral(channel)), int(is_ephemeral(topic)),
                   TopicKeys.of(topic).wake], tuple)

    def create_topic(self, topic: str) -> bool:
        """/topic/create: a topic is its name in the registry until something is published.
        True if it is new."""
        return bool(self._guard(self.redis.sadd, keys.TOPICS, topic))

    def create_channel(self, topic: str, channel: str) -> bool:
        """/channel/create: subscribe without a consumer."""
        return self.subscribe(topic, channel, "")

    def pause_topic(self, topic: str, paused: bool) -> None:
        t = TopicKeys.of(topic)
        self.run(self._fanout_op("pause_topic", topic,
                                 [t.meta, t.channels, t.backlog, t.backlog_deferred, t.due,
                                  t.version],
                                 ["1" if paused else "0", t.wake]))

    def pause_channel(self, topic: str, channel: str, paused: bool) -> None:
        c = ChannelKeys.of(topic, channel)
        self.run(Op("pause_channel", [c.meta, TopicKeys.of(topic).version],
                    ["1" if paused else "0", TopicKeys.of(topic).wake, channel]))

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
        """drop_op, and a deleted topic leaves the topic registry; None if not found."""
        if delete and not channel and not self._guard(self.redis.sismember, keys.TOPICS, topic):
            return None
        dropped = self.run(self.drop_op(topic, channel, delete))
        if delete and not channel:
            self.forget_topic(topic)
        return dropped

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

    def deliver_op(self, topic: str, channel: str, groups: Sequence[tuple],
                   max_attempts: int = 0) -> Op:
        """Pop for each (owner, timeout ms, count): a Delivered, one list of records
        per group. Messages delivered `max_attempts` times already (0: no limit; the channel's
        own setting wins) go to its dead-letter outbox instead."""
        c = ChannelKeys.of(topic, channel)
        args = [channel, max_attempts, 0]
        for owner, timeout_ms, count in groups:
            args += [owner, timeout_ms, count]
        return Op("deliver", [c.queue, c.inflight, c.msgs, c.leases, TopicKeys.of(topic).due,
                              c.meta, c.dead], args, Delivered.parse)

    def deliver(self, topic, channel, groups, max_attempts=0):
        return self.run(self.deliver_op(topic, channel, groups, max_attempts))

    @staticmethod
    def finishing_first(deliver: Op, finish: Op) -> Op:
        """A deliver call of the same channel that also does a finish call's work first:
        the group commit folds FINs into the deliver that follows them."""
        args = deliver.args
        pairs = int(args[2])
        return deliver._replace(args=[*args[:2], pairs + len(finish.args) // 2,
                                      *args[3:3 + 2 * pairs], *finish.args,
                                      *args[3 + 2 * pairs:]])

    def finish_op(self, topic: str, channel: str, pairs: Sequence[tuple]) -> Op:
        """FIN each (owner, id): per pair 1 done, 0 not in flight, -1 owned by another."""
        c = ChannelKeys.of(topic, channel)
        return Op("finish", [c.inflight, c.msgs, c.leases], [x for p in pairs for x in p])

    def finish(self, topic, channel, pairs):
        return self.run(self.finish_op(topic, channel, pairs))

    def requeue_op(self, topic: str, channel: str, triples: Sequence[tuple]) -> Op:
        """REQ each (owner, id, delay ms): per triple 1 done, 0 / -1 as finish."""
        t, c = TopicKeys.of(topic), ChannelKeys.of(topic, channel)
        return Op("requeue",
                  [c.queue, c.inflight, c.msgs, c.leases, c.deferred, c.meta, t.due,
                   t.version],
                  [channel, t.wake, *(x for tr in triples for x in tr)])

    def requeue(self, topic, channel, triples):
        return self.run(self.requeue_op(topic, channel, triples))

    def requeue_in_flight(self, topic: str, channel: str, ids: Sequence[bytes],
                          delivered_by_ms: int | None = None) -> list[int]:
        """Admin requeue: in-flight messages go back to the queue whoever holds them
        (their holder's FIN then fails, as after a timeout). With `delivered_by_ms`,
        only those delivered by then. Per id: 1 requeued, else 0."""
        leases = self._guard(self.redis.hmget, ChannelKeys.of(topic, channel).leases, ids)
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

    def touch_op(self, topic: str, channel: str, max_msg_timeout_ms: int,
                 triples: Sequence[tuple]) -> Op:
        """TOUCH each (owner, id, timeout ms): per triple the new deadline ms, or 0 / -1."""
        c = ChannelKeys.of(topic, channel)
        return Op("touch", [c.inflight, c.leases],
                  [max_msg_timeout_ms, *(x for tr in triples for x in tr)])

    def touch(self, topic, channel, max_msg_timeout_ms, triples):
        return self.run(self.touch_op(topic, channel, max_msg_timeout_ms, triples))

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
        """Set (or with None, clear) a channel setting kept in its meta hash."""
        meta = ChannelKeys.of(topic, channel).meta
        if value is None:
            self._guard(self.redis.hdel, meta, name)
        else:
            self._guard(self.redis.hset, meta, name, value)

    def channel_setting(self, topic: str, channel: str, name: str) -> str | None:
        value = self._guard(self.redis.hget, ChannelKeys.of(topic, channel).meta, name)
        return value.decode() if value is not None else None

    def queued_records(self, topic: str, channel: str, chunk: int):
        """The channel's ready queue, `chunk` records at a time, without taking them."""
        queue, start = ChannelKeys.of(topic, channel).queue, 0
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
        """topic -> its version (news.lua; 0 while it has none) for the topics read: one
        versions.lua call per node (per slot on Redis 6.2). The topics of a call that
        failed are left out, for the next read."""
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
            read.update((t, int(v or 0)) for t, v in zip(group, reply))
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

    def read_topic(self, topic: str) -> dict:
        """Depth and counters of a topic as stored."""
        t = TopicKeys.of(topic)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(t.meta)
        pipe.llen(t.backlog)
        pipe.zcard(t.backlog_deferred)
        meta, backlog, deferred = self._guard(pipe.execute)
        return {"message_count": int(meta.get(b"message_count", 0)),
                "message_bytes": int(meta.get(b"message_bytes", 0)),
                "depth": backlog, "deferred_count": deferred, "paused": b"paused" in meta}

    def read_channel(self, topic: str, channel: str) -> dict:
        """Depth, in-flight, deferred, counters and consumers of a channel as stored."""
        c = ChannelKeys.of(topic, channel)
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(c.queue)
        pipe.zcard(c.inflight)
        pipe.zcard(c.deferred)
        pipe.hgetall(c.meta)
        pipe.hvals(c.consumers)
        depth, inflight, deferred, meta, consumers = self._guard(pipe.execute)
        return {"depth": depth, "in_flight_count": inflight, "deferred_count": deferred,
                "message_count": int(meta.get(b"message_count", 0)),
                "requeue_count": int(meta.get(b"requeue_count", 0)),
                "timeout_count": int(meta.get(b"timeout_count", 0)),
                "dead_count": int(meta.get(b"dead_count", 0)),
                "client_count": sum(int(v) for v in consumers), "paused": b"paused" in meta}
