"""The Store: every change to queue state, as one Lua script call each.

Methods come in pairs: `x_op(...)` builds an `Op` that the broker's group commit
batches with the work of other connections into one pipeline; `x(...)` runs it
alone. Scripts are loaded once and called by SHA; after a Redis restart
(NOSCRIPT) they are loaded again and the failed calls retried.

On Redis Cluster the same calls go in one pipeline per node (_send_per_node). A call
refused because its slot is being moved (TRYAGAIN, or ASK/MOVED that redis-py's own
retries did not settle) did nothing, and is sent again until SLOT_MOVE_PATIENCE has
passed; a script that fans out to a topic's channels and was given a stale list of
them is sent again with the real list (fanout.lua).
"""

import hashlib
import re
import secrets
import time
from importlib import resources
from typing import Callable, Iterator, NamedTuple, Sequence

import redis
from redis.exceptions import RedisClusterException, TryAgainError

from relay.errors import StoreConnectionError, StoreError
from relay.codec import make_record, parse_record
from relay.sockio import send_all
from relay.store import keys
from relay.store.connection import SLOT_MOVING, connect, is_cluster, sharded_pubsub
from relay.store.keys import ChannelKeys, TopicKeys

SCRIPT_NAMES = ("publish", "subscribe", "unsubscribe", "deliver", "finish", "requeue",
                "touch", "scan", "pause_topic", "pause_channel", "drop", "redrive", "due")
CROSS_SLOT = ("due",)  # read-only scripts that reach keys of many slots of one node
SIZE_COMMANDS = {b"list": "LLEN", b"zset": "ZCARD", b"hash": "HLEN", b"none": "EXISTS"}
SLOT_MOVE_PATIENCE = 30.0
REGISTER_EVERY = 10.0
STALE = b"stale"


def _same(value):
    return value


class Op(NamedTuple):
    """One script call; `pre` are plain commands sent just before it (results ignored)."""

    script: str
    keys: Sequence[str]
    args: Sequence
    parse: Callable = _same
    pre: tuple = ()
    redo: Callable | None = None


class Dropped(NamedTuple):
    """What drop.lua took out: the topic's last message id at that moment (the cut:
    everything published later stays) and the trash keys that now hold it."""

    last_id: int
    trash: list

    @classmethod
    def parse(cls, reply) -> "Dropped | None":
        return None if reply is None else cls(reply[0], [k.decode() for k in reply[1:]])


class DueView(NamedTuple):
    now: int
    due: list
    more: bool
    failed: int


class Script(NamedTuple):
    name: str
    source: bytes
    sha: str


def _load_scripts(sharded: bool = False) -> dict:
    """Each script's source, with the file its first line names as `-- include: X.lua`
    put before it. Where `sharded` (a cluster of Redis 7+): wake-ups by SPUBLISH
    instead of PUBLISH, and CROSS_SLOT scripts flagged as such."""
    folder = resources.files("relay.store") / "scripts"
    scripts = {}
    for name in SCRIPT_NAMES:
        source = (folder / f"{name}.lua").read_bytes()
        included = re.match(rb"-- include: (\S+)\n", source)
        if included:
            source = (folder / included.group(1).decode()).read_bytes() + source
        if sharded:
            source = source.replace(b"redis.call('PUBLISH'", b"redis.call('SPUBLISH'")
            if name in CROSS_SLOT:
                source = b"#!lua flags=allow-cross-slot-keys,no-writes\n" + source
        scripts[name] = Script(name, source, hashlib.sha1(source).hexdigest())
    return scripts


def connect_redis(options):
    """A client with bounded waits, so an unreachable Redis fails calls instead of hanging;
    a cluster client if the URL names a cluster node."""
    timeout = options.redis_timeout / 1000
    return connect(options.redis_url, timeout, min(timeout, 2.0), health_check_interval=30)


def _channel_keys(topic: str, channels) -> list:
    return [k for c in channels for k in ChannelKeys.of(topic, c).all()]


def _stale(raw) -> list | None:
    """The topic's real channels if a fan-out script was given a stale list."""
    if isinstance(raw, list) and raw[:1] == [STALE]:
        return sorted(c.decode() for c in raw[1:])
    return None


class Store:
    """Typed access to relay's state in one Redis database."""

    def __init__(self, client: redis.Redis, dedicated: bool = False):
        """`dedicated`: pipelines go over one connection of their own; only for a
        single caller at a time, as the broker's group commit (one server only)."""
        self.redis = client
        self.cluster = is_cluster(client)
        self.dedicated = dedicated and not self.cluster
        self._connection = None
        self.scripts = _load_scripts()
        self.sharded = None
        self._loaded = False
        self._channels: dict[str, list] = {}
        self._registered: dict[str, float] = {}

    def sibling(self) -> "Store":
        """Another Store on the same client (a group-commit lane of its own) that shares
        what this one learned: channel lists and topic registrations."""
        other = Store(self.redis, dedicated=self.dedicated)
        other._channels, other._registered = self._channels, self._registered
        return other

    # -- running ops -------------------------------------------------------

    def load_scripts(self) -> None:
        if self.sharded is None:
            self.sharded = sharded_pubsub(self.redis)
            self.scripts = _load_scripts(self.sharded)
        for script in self.scripts.values():
            self.redis.script_load(script.source)
        self._loaded = True

    def run(self, op: Op):
        result = self.run_many([op])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def run_many(self, ops: Sequence[Op]) -> list:
        """Run ops in one pipeline; each result is a value or the exception for that op."""
        if not self._loaded:
            self._guard(self.load_scripts)
        ops = list(ops)
        results = self._guard(self._execute, ops)
        self._again(ops, results)
        out = []
        for op, r in zip(ops, results):
            if isinstance(r, redis.exceptions.RedisError):
                r = StoreError(f"{op.script}: {r}")
            out.append(r if isinstance(r, Exception) else op.parse(r))
        return out

    def _again(self, ops: list, results: list) -> None:
        """Send again, in place, the calls that found no script (a restarted server, or
        a new cluster node: the scripts are loaded again first), that were refused while
        their slot moved, and the fan-outs given a stale channel list."""
        patience = time.monotonic() + SLOT_MOVE_PATIENCE
        while time.monotonic() < patience:
            again = []
            if any(isinstance(r, redis.exceptions.NoScriptError) for r in results):
                self._guard(self.load_scripts)
            for i, (op, r) in enumerate(zip(ops, results)):
                if isinstance(r, (SLOT_MOVING, redis.exceptions.NoScriptError)):
                    again.append(i)
                elif op.redo is not None and not isinstance(r, Exception):
                    redo = op.redo(r)
                    if redo is not None:
                        ops[i] = redo
                        again.append(i)
            if not again:
                return
            if any(isinstance(results[i], SLOT_MOVING) for i in again):
                time.sleep(0.05)
            for i, r in zip(again, self._guard(self._execute, [ops[i] for i in again])):
                results[i] = r

    def _execute(self, ops: Sequence[Op]) -> list:
        commands = []
        for op in ops:
            commands.extend(op.pre)
            commands.append(("EVALSHA", self.scripts[op.script].sha, len(op.keys),
                             *op.keys, *op.args))
        if self.cluster:
            raw = self._send_per_node(commands)
        elif self.dedicated:
            raw = self._send(commands)
        else:
            raw = self._pipeline(commands)
        results, i = [], 0
        for op in ops:
            i += len(op.pre)
            results.append(raw[i])
            i += 1
        return results

    def _pipeline(self, commands: list) -> list:
        pipe = self.redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return pipe.execute(raise_on_error=False)

    def _send(self, commands: list) -> list:
        """A pipeline on this Store's own connection, without redis-py's per-pipeline
        pool checkout and health checks, written in one send (the broker's group commit
        is its only user)."""
        conn = self._connection
        if conn is None:
            conn = self._connection = self.redis.connection_pool.make_connection()
        try:
            if conn._sock is None:
                conn.connect()
            try:
                send_all(conn._sock, b"".join(conn.pack_commands(commands)))
            except OSError as e:
                raise redis.exceptions.ConnectionError(f"Error writing to socket: {e}") from e
            raw = []
            for _ in commands:
                try:
                    raw.append(conn.read_response())
                except redis.exceptions.ResponseError as e:
                    raw.append(e)
            return raw
        except BaseException:
            conn.disconnect()
            raise

    def _send_per_node(self, commands: list) -> list:
        """A cluster pipeline of our own: each command goes to the node serving its first
        key's slot (a script's keys share one), all nodes written before any is read.
        redis-py's ClusterPipeline asks a server COMMAND GETKEYS for every EVALSHA it
        sends, a round trip each. Commands a node redirected (MOVED, ASK) or refused
        (TRYAGAIN) go again one by one through redis-py, which follows redirects and
        keeps its slot map."""
        groups: dict = {}
        for i, command in enumerate(commands):
            key = command[3] if command[0] == "EVALSHA" else command[1]
            node = self.redis.get_node_from_key(key)
            groups.setdefault(node.name, (node, []))[1].append(i)
        raw: list = [None] * len(commands)
        sent = []
        try:
            for node, indexes in groups.values():
                pool = self.redis.get_redis_connection(node).connection_pool
                conn = pool.get_connection()
                sent.append((pool, conn, indexes))
                conn.send_packed_command(conn.pack_commands([commands[i] for i in indexes]))
            for _, conn, indexes in sent:
                for i in indexes:
                    try:
                        raw[i] = conn.read_response()
                    except redis.exceptions.ResponseError as e:
                        raw[i] = e
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            for _, conn, _ in sent:
                conn.disconnect()
            self._refresh_slots()  # a node may have failed over
            raise
        finally:
            for pool, conn, _ in sent:
                pool.release(conn)
        for i, r in enumerate(raw):
            if isinstance(r, SLOT_MOVING):
                raw[i] = self._redirected(commands[i])
        return raw

    def _redirected(self, command: tuple):
        """A refused command through redis-py's cluster client, which follows MOVED/ASK.
        When redis-py gives up without an answer ('TTL exhausted', or its slot map
        caught half-updated), the command was not run: it counts as refused again, to
        be sent once more after a fresh look at the slots."""
        try:
            return self.redis.execute_command(*command)
        except redis.exceptions.RedisError as e:
            return e
        except (RedisClusterException, AttributeError) as e:
            self._refresh_slots()
            return TryAgainError(f"{command[0]} not routed: {e}")

    @staticmethod
    def _guard(fn, *args):
        try:
            return fn(*args)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
            raise StoreConnectionError(str(e)) from e

    # -- state transitions -------------------------------------------------

    def _fanout_op(self, script: str, topic: str, topic_keys: list, args: list,
                   parse: Callable = _same, pre: tuple = (), extra_keys: Callable = None,
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
            "publish", topic, [t.ids, t.meta, t.channels, t.backlog, t.backlog_deferred, t.due],
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
        """SUB: creates topic and channel as needed; returns True if the channel is new."""
        t, c = TopicKeys.of(topic), ChannelKeys.of(topic, channel)
        return Op("subscribe",
                  [t.channels, t.backlog, t.backlog_deferred, c.queue, c.deferred, c.msgs,
                   c.meta, c.consumers, t.due, t.meta],
                  [channel, broker_id], bool,
                  pre=(("SADD", keys.TOPICS, topic),))

    def subscribe(self, topic, channel, broker_id):
        return self.run(self.subscribe_op(topic, channel, broker_id))

    def unsubscribe_op(self, topic: str, channel: str, broker_id: str,
                       channel_ephemeral: bool, topic_ephemeral: bool) -> Op:
        """A consumer left: 0 kept, 1 ephemeral channel deleted, 2 topic deleted too."""
        t, c = TopicKeys.of(topic), ChannelKeys.of(topic, channel)
        others = [k for k in c.all() if k != c.consumers]
        return Op("unsubscribe", [t.channels, t.meta, c.consumers, t.due, *others],
                  [channel, broker_id, int(channel_ephemeral), int(topic_ephemeral)], int)

    def create_topic(self, topic: str) -> bool:
        """/topic/create: a topic is its name in the registry until something is published.
        True if it is new."""
        return bool(self._guard(self.redis.sadd, keys.TOPICS, topic))

    def create_channel(self, topic: str, channel: str) -> bool:
        """/channel/create: subscribe without a consumer."""
        return self.run(self.subscribe_op(topic, channel, ""))

    def pause_topic(self, topic: str, paused: bool) -> None:
        t = TopicKeys.of(topic)
        self.run(self._fanout_op("pause_topic", topic,
                                 [t.meta, t.channels, t.backlog, t.backlog_deferred, t.due],
                                 ["1" if paused else "0", t.wake]))

    def pause_channel(self, topic: str, channel: str, paused: bool) -> None:
        c = ChannelKeys.of(topic, channel)
        self.run(Op("pause_channel", [c.meta],
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
            "drop", topic, [t.ids, t.channels, t.meta, t.backlog, t.backlog_deferred, t.due],
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

    def trash_sizes(self, trash: Sequence[str]) -> list[tuple[bytes, int]]:
        """(Redis type, entries) of each trash key."""
        pipe = self.redis.pipeline(transaction=False)
        for key in trash:
            pipe.type(key)
        kinds = self._guard(pipe.execute)
        for key, kind in zip(trash, kinds):
            pipe.execute_command(SIZE_COMMANDS[kind], key)
        return list(zip(kinds, self._guard(pipe.execute)))

    def free_trash(self, key: str, count: int) -> Iterator[int]:
        """Free a trash key `count` entries per Redis call, so each call stays short;
        yields how many each call freed."""
        kind = self._guard(self.redis.type, key)
        if kind == b"list":
            return self._free_list(key, count)
        if kind == b"zset":
            return self._free_zset(key, count)
        return self._free_hash(key, count)

    def _free_list(self, key, count):
        while True:
            pipe = self.redis.pipeline(transaction=False)
            pipe.llen(key)
            pipe.ltrim(key, count, -1)
            length, _ = self._guard(pipe.execute)
            if not length:
                return
            yield min(length, count)

    def _free_zset(self, key, count):
        while n := self._guard(self.redis.zremrangebyrank, key, 0, count - 1):
            yield n

    def _free_hash(self, key, count):
        """HSCAN goes on from its cursor: nothing else writes a trash key."""
        cursor = None
        while cursor != 0:
            cursor, fields = self._guard(lambda: self.redis.hscan(key, cursor or 0, count=count))
            if fields:
                yield self._guard(self.redis.hdel, key, *fields)

    def forget_topic(self, topic: str) -> None:
        self._registered.pop(topic, None)
        self.redis.srem(keys.TOPICS, topic)

    def deliver_op(self, topic: str, channel: str, groups: Sequence[tuple],
                   max_attempts: int = 0) -> Op:
        """Pop for each (owner, timeout ms, count): one list of records per group.
        Messages delivered `max_attempts` times already (0: no limit; the channel's
        own setting wins) go to its dead-letter outbox instead."""
        c = ChannelKeys.of(topic, channel)
        args = [channel, max_attempts]
        for owner, timeout_ms, count in groups:
            args += [owner, timeout_ms, count]
        return Op("deliver", [c.queue, c.inflight, c.msgs, c.leases, TopicKeys.of(topic).due,
                              c.meta, c.dead], args)

    def deliver(self, topic, channel, groups, max_attempts=0):
        return self.run(self.deliver_op(topic, channel, groups, max_attempts))

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
                  [c.queue, c.inflight, c.msgs, c.leases, c.deferred, c.meta, t.due],
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
                  [c.queue, c.inflight, c.msgs, c.leases, c.deferred, c.meta, t.due, c.dead],
                  [channel, t.wake, limit], tuple)

    def scan(self, topic, channel, limit=1000):
        return self.run(self.scan_op(topic, channel, limit))

    # -- dead letters (relay/deadletter.py) ----------------------------------

    def claim_dead(self, topic: str, channel: str, token: str, ms: int, count: int) -> list:
        """Up to `count` records of the dead-letter outbox, if no other scanner holds it."""
        c = ChannelKeys.of(topic, channel)
        if not self._guard(lambda: self.redis.set(c.dead_lock, token, nx=True, px=ms)):
            return []
        records = self._guard(self.redis.lrange, c.dead, 0, count - 1)
        if not records:
            self._guard(self.redis.delete, c.dead_lock)
        return records

    def drop_dead(self, topic: str, channel: str, count: int) -> None:
        """Forget the first `count` outbox records (published) and release the claim."""
        c = ChannelKeys.of(topic, channel)
        pipe = self.redis.pipeline(transaction=False)
        pipe.ltrim(c.dead, count, -1)
        pipe.delete(c.dead_lock)
        self._guard(pipe.execute)

    def redrive_op(self, topic: str, channel: str, records: Sequence[bytes]) -> Op:
        """Queue records on one channel again: how many, or -1 if there is no such channel."""
        t, c = TopicKeys.of(topic), ChannelKeys.of(topic, channel)
        return Op("redrive", [t.channels, c.queue], [channel, t.wake, *records])

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

    def list_chunk(self, key: str, start: int, count: int) -> list:
        return self._guard(self.redis.lrange, key, start, start + count - 1)

    def remove_from_list(self, key: str, values: Sequence[bytes]) -> int:
        """LREM each value once; how many were there."""
        pipe = self.redis.pipeline(transaction=False)
        for value in values:
            pipe.lrem(key, 1, value)
        return sum(self._guard(pipe.execute))

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
        groups = self._due_groups(topics)
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
            self._refresh_slots()
        return DueView(now, due, more, failed)

    def _due_groups(self, topics: Sequence[str]) -> list[list]:
        if not self.cluster:
            return [list(topics)] if topics else []
        if not self._loaded:
            self._guard(self.load_scripts)
        groups: dict = {}
        for topic in topics:
            due = TopicKeys.of(topic).due
            node = (self.redis.get_node_from_key(due).name if self.sharded
                    else self.redis.keyslot(due))
            groups.setdefault(node, []).append(topic)
        return list(groups.values())

    def _refresh_slots(self) -> None:
        try:
            self.redis.nodes_manager.initialize()
        except redis.exceptions.RedisError:
            pass  # the next call tries again

    def now_ms(self) -> int:
        """Redis' clock, the one every script uses."""
        sec, usec = self._guard(self.redis.time)
        return sec * 1000 + usec // 1000

    def in_flight(self, topic: str, channel: str, limit: int) -> list[dict]:
        """The `limit` in-flight messages of a channel due first: id, deadline and
        delivery time (ms), owner, attempts."""
        c = ChannelKeys.of(topic, channel)
        entries = self._guard(
            lambda: self.redis.zrange(c.inflight, 0, limit - 1, withscores=True))
        if not entries:
            return []
        ids = [msg_id for msg_id, _ in entries]
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(c.leases, ids)
        pipe.hmget(c.msgs, ids)
        leases, records = self._guard(pipe.execute)
        out = []
        for (msg_id, deadline), lease, record in zip(entries, leases, records):
            if lease is None or record is None:
                continue  # finished meanwhile
            delivered, _, owner = lease.decode().partition(" ")
            out.append({"id": msg_id.decode(), "deadline_ms": int(deadline),
                        "delivered_ms": int(delivered), "owner": owner,
                        "attempts": parse_record(record)[1]})
        return out

    def in_flight_ids(self, topic: str, channel: str, count: int) -> Iterator[list[bytes]]:
        """Every id in flight for the whole iteration, about `count` per Redis call
        (ZSCAN: ids may repeat, and ids that come or go meanwhile may be missed)."""
        key, cursor = ChannelKeys.of(topic, channel).inflight, None
        while cursor != 0:
            cursor, entries = self._guard(lambda: self.redis.zscan(key, cursor or 0, count=count))
            if entries:
                yield [msg_id for msg_id, _ in entries]

    def topic_names(self) -> list[str]:
        return sorted(n.decode() for n in self._guard(self.redis.smembers, keys.TOPICS))

    def channel_names(self, topic: str) -> list[str]:
        names = self._guard(self.redis.smembers, TopicKeys.of(topic).channels)
        return sorted(n.decode() for n in names)

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

    def add_e2e_buckets(self, slot: int, counts: dict, expire_at_ms: int) -> None:
        """Add {(topic, channel): {bucket: FINs}} to half-window `slot` (relay/latency.py)."""
        pipe = self.redis.pipeline(transaction=False)
        for (topic, channel), buckets in counts.items():
            key = ChannelKeys.of(topic, channel).e2e(slot)
            for index, n in buckets.items():
                pipe.hincrby(key, index, n)
            pipe.pexpireat(key, expire_at_ms)
        self._guard(pipe.execute)

    def e2e_buckets(self, pairs: Sequence[tuple], slots: Sequence[int]) -> list[dict]:
        """{bucket: FINs} of each (topic, channel), summed over `slots`."""
        pipe = self.redis.pipeline(transaction=False)
        for topic, channel in pairs:
            for slot in slots:
                pipe.hgetall(ChannelKeys.of(topic, channel).e2e(slot))
        replies = iter(self._guard(pipe.execute))
        out = []
        for _ in pairs:
            counts: dict = {}
            for _ in slots:
                for k, v in next(replies).items():
                    counts[int(k)] = counts.get(int(k), 0) + int(v)
            out.append(counts)
        return out

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
