"""What every part of the Store shares: the Redis client and the ScriptRunner that sends
the calls, the partition counts it caches, the channel lists that fan-out calls are given
(a stale list makes the call come back to be sent again with the real one, fanout.lua)
and the node keys of the node serving each part (relay/store/nodes.py)."""

import itertools
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Self, Sequence, TypeVar

from relay.errors import StoreError
from relay.store import keys, placement
from relay.store import batchers
from relay.store.batchers import Batchers, FanOut
from relay.store.connection import RedisClient
from relay.store.keys import TopicKeys
from relay.store.nodes import Nodes
from relay.store.runner import Op, ScriptRunner, guarded, identity

if TYPE_CHECKING:
    from relay.options import Options

PARTITIONS_TTL = 1.0    # how long a topic's partition count is taken as read
PARTS_BATCH = 1000      # topics whose partitions parts_of() reads per pipeline

_T = TypeVar("_T")


def replication(options: "Options", socket_timeout: int | None = None) -> dict:
    """Store arguments for --wait-replicas. WAIT gets half the connection's timeout
    (--redis-timeout unless given, ms), so the server answers before the connection
    gives up on the whole pipeline (FINs and all): Redis may end a WAIT up to 100 ms
    late (hz 10)."""
    timeout = socket_timeout or options.redis_timeout
    return {"wait_replicas": options.wait_replicas, "wait_timeout": max(1, timeout // 2)}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _partitions_reply(reply: list) -> list:
    """partitions.lua's reply: [now, before, made, placement, order key rule, channels,
    priority rule]."""
    return [*(int(n) for n in reply[:3]), _text(reply[3]), _text(reply[4]), int(reply[5]),
            _text(reply[6])]


class Confirmed:
    """When a read of the news last found the partition counts of a set of topics
    current (their news unmoved since the counts were read): one time for them all, so
    that a read that finds nothing new confirms thousands at once."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at


NEVER = Confirmed(float("-inf"))


class Core:
    """The client, the runner and the caches that the Store's parts share."""

    _guard = staticmethod(guarded)

    def __init__(self, client: RedisClient, dedicated: bool = False, wait_replicas: int = 0,
                 wait_timeout: int = 0, topic_partitions: int = 1,
                 topic_retention_ms: int = 0,
                 lookup: Callable[[Op], Any] | None = None) -> None:
        """`dedicated`, `wait_replicas`, `wait_timeout`: see ScriptRunner;
        `topic_partitions`, `topic_retention_ms`: the partition count and retention
        (--retention-time; 0: none) of topics this Store creates; `lookup`: how the
        partition counts it misses are read (run(op) unless given: a broker's go through
        its group commit, so a burst of SUBs and PUBs to new topics is one pipeline)."""
        self.redis = client
        self.runner = ScriptRunner(client, Batchers(self), dedicated, wait_replicas,
                                   wait_timeout)
        self.cluster = self.runner.cluster
        self.nodes = Nodes(client)
        self.topic_partitions = topic_partitions
        self.topic_retention_ms = topic_retention_ms
        self._channels: dict[str, list[str]] = {}
        self._registered: dict[str, float] = {}
        self._partitions: dict[str, tuple[tuple[str, ...], float]] = {}  # part names, when
        self._confirmed: dict[str, Confirmed] = {}     # topic -> when its count was found current
        # topics whose partition count changed since the wake-up listener last looked
        # (WakeupListener._grow: their local channels join the new parts)
        self.recounted: set[str] = set()
        self._order_rules: dict[str, str] = {}  # topic -> its order key rule, read with it
        self._priority_rules: dict[str, str] = {}   # topic -> its priority rule, read with it
        self._channel_counts: dict[str, int] = {}   # topic -> its channels, read with it
        self._reading: dict[str, threading.Lock] = {}   # one read per topic at a time
        self._unread: dict[str, tuple[StoreError, float]] = {}  # a failed read, and when
        self.lookup: Callable[[Op], Any] = lookup or self.run
        # from a random part: short-lived publishers (a Spark task, relay-admin pub)
        # spread over the parts too
        self.turns = itertools.count(secrets.randbelow(keys.MAX_PARTITIONS))

    def sibling(self, dedicated: bool | None = None, wait_replicas: int | None = None,
                wait_timeout: int | None = None) -> Self:
        """Another Store on the same client (a group-commit lane of its own) that shares
        what this one learned: channel lists, topic registrations, partition counts.
        `dedicated`, `wait_replicas`, `wait_timeout`: as Store takes them, this one's
        unless given (a broker's lanes: what a lane learns, the Store that builds the
        ops knows)."""
        runner = self.runner
        other = type(self)(
            self.redis, runner.dedicated if dedicated is None else dedicated,
            runner.wait_replicas if wait_replicas is None else wait_replicas,
            runner.wait_timeout if wait_timeout is None else wait_timeout,
            self.topic_partitions, self.topic_retention_ms, self.lookup)
        other._channels, other._registered = self._channels, self._registered
        other._partitions, other.turns = self._partitions, self.turns
        other._confirmed = self._confirmed
        other._reading = self._reading
        other._unread, other._order_rules = self._unread, self._order_rules
        other._priority_rules = self._priority_rules
        other._channel_counts = self._channel_counts
        other.recounted = self.recounted
        other.nodes = self.nodes
        return other

    def replication(self) -> dict:
        """This Store's wait for replicas, as Store(...) takes it."""
        return {"wait_replicas": self.runner.wait_replicas,
                "wait_timeout": self.runner.wait_timeout}

    def run(self, op: Op) -> Any:
        return self.runner.run(op)

    def run_many(self, ops: Sequence[Op], follow: bool = True) -> list:
        """Run ops in one pipeline; each result is a value or the exception for that op
        (ScriptRunner.run_many)."""
        return self.runner.run_many(ops, follow)

    def in_rounds(self, parts: Sequence[_T], op_of: Callable[[_T], Op],
                  seconds: float | None = None) -> int:
        """op_of(part) on each part, in one pipeline, then again on those whose reply (a
        count first, and `more`) took something and says more is left, until none does
        or, given `seconds`, they have passed (one round at least): the counts summed.
        Each call is bounded, so Redis serves others in between."""
        done, left = 0, list(parts)
        deadline = None if seconds is None else time.monotonic() + seconds
        while left:
            replies = self.run_many([op_of(part) for part in left])
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
                done += reply[0]
            left = [part for part, reply in zip(left, replies) if reply.more and reply[0]]
            if deadline is not None and time.monotonic() > deadline:
                break
        return done

    def fanout_op(self, script: str, part: str, head_keys: list[str], args: list[Any],
                   parse: Callable[[Any], Any] = identity, pre: tuple[tuple[Any, ...], ...] = (),
                   channels: list[str] | None = None, trash: str = "", job: Any = None) -> Op:
        """A call of a script that touches every channel of the part (fanout.lua), with
        the channels this Store last saw unless given; a stale reply sends it again with
        the real ones (batchers.Batcher.again). `trash`: drop.lua's trash keys' prefix."""
        if channels is None:
            channels = self._channels.get(part, [])
        return batchers.fanout_op(script, FanOut(part, len(head_keys), trash), head_keys, args,
                         channels, parse, pre, job)

    def channel_count(self, topic: str) -> int:
        """How many channels the topic has (each part has them all), as this Store last
        heard: with its partition count, a SUB's answer or a fan-out call's list."""
        return self._channel_counts.get(topic, 0)

    def learn_channel_count(self, topic: str, count: int) -> None:
        self._channel_counts[topic] = count

    def learn_channels(self, part: str, channels: list[str]) -> None:
        """The part's channels, as a fan-out call found them."""
        self._channels[part] = channels
        self._channel_counts[keys.split_part(part)[0]] = len(channels)

    def partitions_op(self, topic: str, raise_to: int = 0, salts: str | None = None) -> Op:
        """The topic's partition count, [now, before, made, placement, order key rule,
        channels, priority rule] (relay/store/ordering.py, priorities.py); a new topic takes
        this Store's default count and retention (made: 1 if this call gave it the
        latter), and `raise_to` raises the count. The new parts take `salts` (unless
        given, this Store's placement for the count it may set)."""
        t = TopicKeys.of(topic)
        if salts is None:
            salts = self.placement(topic, max(raise_to, self.topic_partitions))
        return Op("partitions", [t.version, t.meta, t.channels],
                  [self.topic_partitions, raise_to, t.wake, self.node(topic),
                   self.topic_retention_ms, salts], _partitions_reply)

    def placement(self, topic: str, count: int) -> str:
        """The salts that put `count` parts of the topic on the masters evenly, by this
        client's slot map (placement.py); none on one server."""
        if not self.cluster or count < 2:
            return ""
        return placement.placement(topic, count, self.nodes.owners())

    def partitions(self, topic: str, fresh: bool = False) -> int:
        """The topic's partition count, as read at most PARTITIONS_TTL ago unless `fresh`."""
        asked = time.monotonic()
        known = self._partitions.get(topic)
        if known and not fresh and asked - self._read_at(topic, known[1]) < PARTITIONS_TTL:
            return len(known[0])
        # the SUBs and PUBs of a burst that meet a new topic wait for one read of it
        with self._reading.setdefault(topic, threading.Lock()):
            known = self._partitions.get(topic)
            if known and known[1] >= asked:
                return len(known[0])
            failed = self._unread.get(topic)
            if failed and failed[1] >= asked:
                raise failed[0]     # the read they waited for failed: so does theirs
            try:
                return self._learned(topic, self.lookup(self.partitions_op(topic)))
            except StoreError as e:
                self._unread[topic] = (e, time.monotonic())
                raise

    def _read_at(self, topic: str, learned: float) -> float:
        """When the topic's partition count, learned then, was last read or confirmed."""
        return max(learned, self._confirmed.get(topic, NEVER).at)

    def _learned(self, topic: str, reply: list) -> int:
        """The count of partitions_op's reply, its parts' names learned (and retention
        given to the parts of a topic it made)."""
        count, _, made, salts, rule, channels, priority_rule = reply
        names = keys.part_names(topic, count, salts)
        self._order_rules[topic] = rule
        self._priority_rules[topic] = priority_rule
        self._channel_counts[topic] = channels
        self.learn_parts(topic, names)
        if made and count > 1:
            self._retain_parts(names[1:])
        return count

    def _retain_parts(self, parts: list[str]) -> None:
        """The parts beyond the first of a topic new with retention get it too (part 0
        has it from partitions.lua)."""
        pipe = self.redis.pipeline(transaction=False)
        for part in parts:
            pipe.hset(TopicKeys.of(part).meta, "retention_ms", self.topic_retention_ms)
        self._guard(pipe.execute)

    def learn_partitions(self, topic: str, count: int, salts: str = "",
                         rule: str | None = None, priority_rule: str | None = None) -> None:
        """The topic's count and placement as read (partitions.lua), and its order key
        and priority rules if read with them."""
        self.learn_parts(topic, keys.part_names(topic, count, salts))
        if rule is not None:
            self._order_rules[topic] = rule
        if priority_rule is not None:
            self._priority_rules[topic] = priority_rule

    def knows(self, topic: str) -> bool:
        """Whether the topic's partition count was ever read here."""
        return topic in self._partitions

    def confirm(self, topic: str, confirmed: Confirmed) -> None:
        """The topic's count holds as of `confirmed` (its news has not moved since it
        was read: Reads.versions)."""
        self._confirmed[topic] = confirmed

    def known_rule(self, topic: str) -> str:
        """The topic's order key rule as last read with its count ("": none, or unread)."""
        return self._order_rules.get(topic, "")

    def known_priority_rule(self, topic: str) -> str:
        """The topic's priority rule as last read with its count ("": none, or unread)."""
        return self._priority_rules.get(topic, "")

    def known_plain(self, topic: str) -> bool:
        """The topic's count was read, and with it no order key rule: its publishes
        need no order keys (one test per PUB, on the hot path)."""
        return topic in self._partitions and not self._order_rules.get(topic) \
            and not self._priority_rules.get(topic)

    def forget_registered(self, topic: str) -> None:
        """The next publish to the topic registers it again (it was unregistered)."""
        self._registered.pop(topic, None)

    def learn_parts(self, topic: str, names: Sequence[str]) -> None:
        known = self._partitions.get(topic)
        if known is not None and len(known[0]) != len(names):
            self.recounted.add(topic)
        self._partitions[topic] = (tuple(names), time.monotonic())

    def parts(self, topic: str, fresh: bool = False) -> list[str]:
        """The names the topic's parts are stored under (keys.part_names)."""
        self.partitions(topic, fresh)
        return list(self._partitions[topic][0])

    def parts_of(self, topics: Sequence[str]) -> list[list[str]]:
        """parts() of each topic, those not read within PARTITIONS_TTL read together in
        pipelines of PARTS_BATCH (/stats over thousands of topics)."""
        now = time.monotonic()
        stale = [t for t in topics if t not in self._partitions
                 or now - self._read_at(t, self._partitions[t][1]) >= PARTITIONS_TTL]
        for start in range(0, len(stale), PARTS_BATCH):
            batch = stale[start:start + PARTS_BATCH]
            for topic, reply in zip(batch, self.run_many([self.partitions_op(t)
                                                          for t in batch])):
                if isinstance(reply, Exception):
                    raise reply
                self._learned(topic, reply)
        return [list(self._partitions[t][0]) for t in topics]

    def part(self, topic: str, index: int) -> str:
        """The name of part `index` of the topic (its plain name if the topic has no such
        part: a call there finds nothing). Part 0 is the topic, with no read."""
        if index == 0:
            return topic
        count = self.partitions(topic)
        return self._partitions[topic][0][index] if 0 < index < count else \
            keys.part_name(topic, index)

    def node(self, part: str) -> str:
        """The prefix of the node keys of the node serving `part` (nodes.py), which the
        scripts that write them are given."""
        return self.nodes.prefix(part)

    def now_ms(self) -> int:
        """Redis' clock, the one every script uses."""
        sec, usec = self._guard(self.redis.time)
        return sec * 1000 + usec // 1000
