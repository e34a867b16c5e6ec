"""The Store's data path, used by brokers (and by the Spark connector and relay-admin pub
and tail): publish, subscribe and leave, deliver, finish, requeue and touch, and the
scanner's scan. Each is one Lua script call: `x_op(...)` builds the Op that a broker's
group commit batches with other connections' work into one pipeline; `x(...)` runs it
alone."""

import secrets
import time
from typing import Any, Callable, Sequence

from relay.codec import is_ephemeral, stored_timestamp
from relay.errors import StoreError
from relay.store import codes, inflight, keys
from relay.store.base import Core
from relay.store.keys import ChannelKeys, TopicKeys, id_part, split_part
from relay.store.replies import Delivered, Published, Stepped, Subscribed, Tokens
from relay.store.batchers import FINISH_HEAD, Publishing, items_merging, stage_op
from relay.store.runner import MAX_CALL_ARGS, Op

REGISTER_EVERY = 10.0
# an MPUB of more messages is staged in a list first, then committed and published in
# steps (publish_commit.lua, publish_step.lua), as one call of them all would pass
# MAX_CALL_ARGS and hold Redis long
INLINE_BODIES = MAX_CALL_ARGS // 2
# a keyed publish call's messages at most (a body and a key each); a bigger one is split
KEYED_BODIES = INLINE_BODIES // 2
# a publish of this many messages at most merges with others (Op.merge) on its part's
# commit lane: one-message commands and small batches. A bigger one is a batch already,
# and goes on its connection's lane, so one producer's MPUBs and another's are in flight
# at once (all of a part's on one lane ran 0.74x as fast for MPUBs of 100 from 2 producers)
MERGED_BODIES = 16

# a part of more channels than this publishes each message (but keyed ones) in steps of
# this many channels (lib/wide.lua): one call to every channel of 5,000 held Redis for
# 90 ms, and every other client with it
WIDE_CHANNELS = 200

# a committed staged publish no call advanced for this long is finished by the scanner's
# sweep: its broker died (a live one's steps follow each other within a round trip)
STALLED_MS = 10_000


def _topic_keys(t: TopicKeys) -> list[str]:
    """The topic keys of publish.lua and the staged publish's calls, in their order."""
    return [t.ids, t.meta, t.channels, t.backlog, t.backlog_deferred, t.due, t.version,
            t.history]


def _merging_publish(p: Publishing) -> Op:
    """A small publish, to be built into a call with the others of its part on its lane
    that merge with it (batchers.Publish): its call is built once, there, with the
    channel list known then."""
    bodies, publish_keys, _, order_keys, priorities = p.group
    keyed = bool(publish_keys)
    return Op("publish", (), (), lane=p.part,
              merge=("publish", p.part, p.defer_ms, keyed, bool(order_keys), bool(priorities)),
              size=_publish_size(bodies, keyed), job=p)


def _publish_size(bodies: Sequence[bytes], keyed: bool) -> int:
    """A publish's size in a merged call (Op.size): its arguments, and a KiB of its
    bodies as one, so a merged call stays under the bound of arguments and near 5 MB."""
    return len(bodies) * (1 + keyed) + sum(map(len, bodies)) // 1024


def _leave_keys(topic: str, channel: str) -> list[str]:
    """The keys of a consumer leaving a channel (lib/leave.lua's layout)."""
    t, c = TopicKeys.of(topic), ChannelKeys.of(topic, channel)
    return [t.channels, t.meta, c.consumers, t.due, *(k for k in c.all() if k != c.consumers)]


class DataPath(Core):
    """The state transitions of messages and consumers."""

    def publish_op(self, topic: str, bodies: Sequence[bytes], defer_ms: int = 0,
                   timestamp_ns: int | None = None, index: int | None = None,
                   publish_keys: Sequence[bytes] | None = None,
                   order_keys: "Sequence[bytes | None] | None" = None,
                   priorities: Sequence[int] | None = None) -> Op:
        """PUB/MPUB/DPUB to part `index` of the topic, else to its parts in turn (one
        call's messages stay together): returns the count of the last message. With
        the count unreadable it goes to part 0, which every topic has: the call itself
        then fails or lands. `publish_keys`, one per body and at most KEYED_BODIES (the
        caller picks the part: relay/store/dedup.py), make it return the number of
        duplicates instead. `order_keys` (an order key or None per body, at most
        KEYED_BODIES; the caller picks the part) pass ordered channels' gates
        (relay/store/ordering.py). `priorities` (0-9 per body, at most KEYED_BODIES; None:
        all 0) go in the ids, and each channel delivers the higher first
        (lib/queue.lua)."""
        try:
            count = self.partitions(topic)
        except StoreError:
            count = 1
        if index is None:
            index = next(self.turns) % count if count > 1 else 0
        part = self.part(topic, index)
        ts = stored_timestamp(timestamp_ns or time.time_ns())
        pre = self._register(topic, count)
        group = (bodies, publish_keys, pre, order_keys, priorities)
        keyed = bool(publish_keys or order_keys or priorities)
        wide = not keyed and self.channel_count(topic) > WIDE_CHANNELS
        if len(bodies) <= MERGED_BODIES and not wide:
            return _merging_publish(Publishing(part, index, ts, defer_ms, group))
        if keyed or (len(bodies) <= INLINE_BODIES and not wide):
            return self.inline_publish_op(part, index, ts, defer_ms, [group])
        token = secrets.token_hex(8)
        stage, t = keys.staging_key(part, token), TopicKeys.of(part)
        commit = self.fanout_op("publish_commit", part,
                                 [*_topic_keys(t), stage, t.publishing, keys.snapshot_key(stage)],
                                 [ts, defer_ms, len(bodies), token, index,
                                  WIDE_CHANNELS if wide else 0, WIDE_CHANNELS],
                                 int, pre=pre, channels=[] if wide else None, job=token)
        return stage_op(stage, bodies, 0, commit)

    def inline_publish_op(self, part: str, index: int, ts: bytes, defer_ms: int,
                          groups: list[tuple]) -> Op:
        """One publish.lua call of the (bodies, publish keys or None, registry commands,
        order keys or None, priorities or None) of each group: one publish's, or several merged (Op.merge: the
        group commit merges those of a part with the same delay, keyed-ness and
        ordered-ness: batchers.Publish). Each group's result is as its own call's: the
        count of its last message, or with keys its duplicates."""
        t = TopicKeys.of(part)
        keyed, ordered, prioritized = bool(groups[0][1]), bool(groups[0][3]), bool(groups[0][4])
        bodies = [body for group in groups for body in group[0]]
        pre = tuple(dict.fromkeys(command for group in groups for command in group[2]))
        args = [t.wake, ts, defer_ms, index, self.node(part), len(bodies) if keyed else 0,
                " ".join(str(len(group[0])) for group in groups) if len(groups) > 1 else "",
                b"\n".join(key or b"" for group in groups for key in group[3]) if ordered
                else "",
                "".join(map(str, (p for group in groups for p in group[4]))) if prioritized
                else "", *bodies]
        if keyed:
            args.append(b" ".join(key for group in groups for key in group[1]))
        head_keys = [*_topic_keys(t), keys.dedup_key(part)] if keyed else _topic_keys(t)
        if len(groups) > 1:
            return self.fanout_op("publish", part, head_keys, args, Published.parse, pre)
        return self.fanout_op("publish", part, head_keys, args,
                               Published.duplicates if keyed else int, pre)

    def publish_step_op(self, part: str, token: str, channels: list[str] | None = None) -> Op:
        """The next step of a committed staged publish (publish_step.lua), naming
        `channels` (a wide one's next slice) or those this Store knows: a Stepped."""
        t = TopicKeys.of(part)
        stage = keys.staging_key(part, token)
        return self.fanout_op("publish_step", part,
                               [*_topic_keys(t), stage, t.publishing, keys.snapshot_key(stage)],
                               [t.wake, split_part(part)[1], self.node(part), token,
                                WIDE_CHANNELS], Stepped.parse, channels=channels)

    def finish_stalled(self, parts: Sequence[str], seconds: float | None = None) -> int:
        """Steps of the staged publishes of `parts` that no call advanced for STALLED_MS
        (their broker died, or lost Redis, between commit and last step) until each is
        done or, given `seconds` (the scanner's sweep), until they have passed: the
        messages published. A wide publish's steps name the slice its last step gave."""
        pipe = self.redis.pipeline(transaction=False)
        for part in parts:
            pipe.hgetall(TopicKeys.of(part).publishing)
        stalled_before = self.now_ms() - STALLED_MS
        stalled = [(part, token.decode())
                   for part, markers in zip(parts, self._guard(pipe.execute))
                   for token, marker in markers.items()
                   if int(marker.split()[3]) < stalled_before]
        done, left = 0, [(part, token, None) for part, token in stalled]
        deadline = None if seconds is None else time.monotonic() + seconds
        while left:
            replies = self.run_many([self.publish_step_op(*step) for step in left])
            going_on = []
            for (part, token, _), reply in zip(left, replies):
                if isinstance(reply, Exception):
                    raise reply
                done += reply.published
                if reply.more and (reply.published or reply.channels):
                    going_on.append((part, token, reply.channels))
            left = going_on
            if deadline is not None and time.monotonic() > deadline:
                break
        return done

    def _register(self, topic: str, partitions: int = 1) -> tuple[tuple[Any, ...], ...]:
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
                    ("SADD", keys.PARTITIONS, *self.parts(topic)[1:]))
        return (("SADD", keys.TOPICS, topic),)

    def publish(self, topic: str, bodies: Sequence[bytes], defer_ms: int = 0,
                index: int | None = None) -> int:
        return self.run(self.publish_op(topic, bodies, defer_ms, index=index))

    def subscribe_op(self, part: str, channel: str, broker_id: str) -> Op:
        """SUB in one part: creates topic and channel as needed; returns a Subscribed."""
        t, c = TopicKeys.of(part), ChannelKeys.of(part, channel)
        topic, index = split_part(part)
        registry = ("SADD", keys.PARTITIONS, part) if index else ("SADD", keys.TOPICS, topic)
        return Op("subscribe",
                  [t.channels, t.backlog, t.backlog_deferred, c.queue, c.deferred, c.msgs,
                   c.meta, c.consumers, t.due, t.meta, t.version, t.ids, t.publishing,
                   c.urgent],
                  [channel, broker_id, self.node(part)], Subscribed.parse, pre=(registry,))

    def subscribe(self, topic: str, channel: str, broker_id: str) -> bool:
        """SUB on every part: True if the channel is new."""
        joined = self.join_parts(topic, channel, broker_id)
        self.learn_channel_count(topic, joined[0].channels)
        return joined[0].created

    def join_parts(self, topic: str, channel: str, broker_id: str) -> list[Subscribed]:
        """subscribe.lua on every part, each one's Subscribed; a backlog the first
        channel takes in steps has gone over when it returns."""
        parts = self.parts(topic)
        joined = self.run_many([self.subscribe_op(part, channel, broker_id) for part in parts])
        for reply in joined:
            if isinstance(reply, Exception):
                raise reply
        for part, reply in zip(parts, joined):
            if reply.hand_over:
                self.hand_over(part)
        return joined

    def pause_topic_op(self, part: str, mode: str) -> Op:
        """pause_topic.lua on one part: mode 1 pauses, 0 unpauses (CODE.MORE: not all
        of the backlog moved yet), `step` moves the next step of an unpause under way."""
        t = TopicKeys.of(part)
        return self.fanout_op("pause_topic", part,
                              [t.meta, t.channels, t.backlog, t.backlog_deferred, t.due,
                               t.version], [mode, t.wake, self.node(part)])

    def hand_over(self, part: str) -> None:
        """The steps of an unpause under way, or of a first channel's backlog
        (subscribe.lua), until none is left: each moves a bounded part of the backlog,
        so other clients wait for no more than one step."""
        while self.run(self.pause_topic_op(part, "step")) == codes.MORE:
            pass

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
                   TopicKeys.of(part).wake, self.node(part)], tuple)

    def deliver_op(self, part: str, channel: str, groups: Sequence[tuple],
                   max_attempts: int = 0, taken: bool = False, lots: bool = False) -> Op:
        """Pop from one part for each (owner, timeout ms, count[, most bytes]): a
        Delivered, one list of records per group. Messages delivered `max_attempts` times
        already (0: no limit; the channel's own setting wins) go to its dead-letter outbox
        instead. A channel with a rate limit delivers only if the counts were `taken`
        from it first (tokens_op). With `lots` (data layout 4 in force), a group of 2 or
        more records goes in flight as a lot (on an ordered channel too, since 0.6.1),
        whose messages
        FIN, REQ and TOUCH name by their lot items (inflight.lot_item)."""
        c = ChannelKeys.of(part, channel)
        args = [channel, max_attempts, 0]
        for owner, timeout_ms, count, *most_bytes in groups:
            args += [owner, timeout_ms, count, most_bytes[0] if most_bytes else 0]
        t = TopicKeys.of(part)
        args += [int(taken), int(lots), t.wake, self.node(part)]
        return Op("deliver", [c.queue, c.inflight, c.msgs, t.due, c.meta, c.dead,
                              c.deferred, c.gate, c.key_of, c.waiting, c.urgent, t.version],
                  args,
                  Delivered.parse)

    def deliver_many_op(self, part: str, channels: Sequence[tuple],
                        max_attempts: int = 0, lots: bool = False) -> Op:
        """deliver_op's work for each (channel, groups[, taken]) of one part, in one call
        (deliver_many.lua): a list of one Delivered per channel, in their order."""
        t = TopicKeys.of(part)
        call_keys = [t.due, t.version]
        args = [max_attempts, int(lots), t.wake, self.node(part)]
        for channel, groups, *taken in channels:
            c = ChannelKeys.of(part, channel)
            call_keys += [c.queue, c.inflight, c.msgs, c.meta, c.dead, c.deferred, c.gate,
                          c.key_of, c.waiting, c.urgent]
            args += [channel, int(bool(taken and taken[0])), len(groups)]
            for group in groups:
                args += group
        return Op("deliver_many", call_keys, args, Delivered.parse_many)

    def tokens_op(self, topic: str, channel: str, count: int) -> Op:
        """Take up to `count` messages from the channel's rate limit (a negative count
        gives them back), one bucket on part 0 for all its parts: a Tokens."""
        return Op("tokens", [ChannelKeys.of(topic, channel).meta], [count], Tokens.parse)

    def deliver(self, topic: str, channel: str, groups: Sequence[tuple],
                max_attempts: int = 0) -> list:
        """deliver_op over the topic's parts, starting at the next in turn, until each
        group has its count or every part was asked: one list of records per group. On a
        channel with a rate limit, what the limit allows now, taken from it first."""
        got, limited = self._deliver_parts(topic, channel, groups, max_attempts, False)
        if not limited:
            return got
        tokens = self.run(self.tokens_op(topic, channel, sum(g[2] for g in groups)))
        left, capped = tokens.taken, []
        for group in groups:
            capped.append((*group[:2], min(group[2], left), *group[3:]))
            left -= capped[-1][2]
        got, _ = self._deliver_parts(topic, channel, capped, max_attempts, True)
        unused = tokens.taken - sum(map(len, got))
        if unused and tokens.rate is not None:
            self.run(self.tokens_op(topic, channel, -unused))
        return got

    def _deliver_parts(self, topic: str, channel: str, groups: Sequence[tuple],
                       max_attempts: int, taken: bool) -> tuple[list, bool]:
        """deliver()'s calls (on one part, its Delivered), and whether a part said the
        channel has a rate limit."""
        parts = self.parts(topic)
        if len(parts) == 1:
            reply = self.run(self.deliver_op(topic, channel, groups, max_attempts, taken))
            return reply, reply.limited
        first = next(self.turns)
        wanted = [count for _, _, count, *_ in groups]
        got: list[list] = [[] for _ in groups]
        limited = False
        for turn in range(len(parts)):
            short = [i for i, n in enumerate(wanted) if len(got[i]) < n]
            if not short:
                break
            part = parts[(first + turn) % len(parts)]
            reply = self.run(self.deliver_op(
                part, channel,
                [(*groups[i][:2], wanted[i] - len(got[i]), *groups[i][3:]) for i in short],
                max_attempts, taken))
            limited = limited or reply.limited
            for i, records in zip(short, reply):
                got[i].extend(records)
        return got, limited

    def finish_op(self, part: str, channel: str, pairs: Sequence[tuple]) -> Op:
        """FIN each (owner, id or lot item) of one part, a lot's items that follow each
        other as one argument (inflight.fin_args): per pair 1 done, 0 not in flight, -1
        owned by another."""
        t, c = TopicKeys.of(part), ChannelKeys.of(part, channel)
        return items_merging(Op("finish",
                                [c.inflight, c.msgs, c.deferred, c.queue, c.gate,
                                 c.key_of, c.waiting, c.meta, c.urgent, t.due, t.version],
                                [channel, t.wake, self.node(part),
                                 *inflight.fin_args(pairs)]), FINISH_HEAD)

    def finish(self, topic: str, channel: str, pairs: Sequence[tuple]) -> list:
        return self._by_part(self.finish_op, topic, channel, pairs)

    def _by_part(self, make_op: Callable[..., Op], topic: str, channel: str,
                 items: Sequence[tuple], *shared: Any) -> list:
        """make_op(part, channel, *shared, items) for the items of each part (by the
        part their id, item[1], names), in one pipeline: the codes in items' order."""
        return self.run_by_part(self.by_part(make_op, topic, channel, items, *shared))

    def by_part(self, make_op: Callable[..., Op], topic: str, channel: str,
                items: Sequence[tuple], *shared: Any) -> list[tuple[Op, list[int]]]:
        """(op, positions of its items) for each part the items' ids name."""
        positions: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            positions.setdefault(max(id_part(item[1]), 0), []).append(i)
        return [(make_op(self.part(topic, index), channel, *shared, [items[i] for i in where]),
                 where) for index, where in positions.items()]

    def run_by_part(self, calls: list[tuple[Op, list[int]]]) -> list:
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
        return items_merging(Op("requeue",
                                [c.queue, c.inflight, c.msgs, c.deferred, c.meta,
                                 t.due, t.version, c.urgent],
                                [channel, t.wake, self.node(part),
                                 *(x for tr in triples for x in tr)]), 3)

    def requeue(self, topic: str, channel: str, triples: Sequence[tuple]) -> list:
        return self._by_part(self.requeue_op, topic, channel, triples)

    def touch_op(self, part: str, channel: str, triples: Sequence[tuple]) -> Op:
        """TOUCH each (owner, id, timeout ms from now) of one part: per triple the new
        deadline ms, or 0 / -1. The caller caps the timeouts (--max-msg-timeout)."""
        c = ChannelKeys.of(part, channel)
        return items_merging(Op("touch", [c.inflight, c.msgs, c.deferred, c.meta],
                                [x for tr in triples for x in tr]), 0)

    def touch(self, topic: str, channel: str, triples: Sequence[tuple]) -> list:
        return self._by_part(self.touch_op, topic, channel, triples)

    def scan_op(self, topic: str, channel: str, limit: int) -> Op:
        """Requeue expired and due messages: (timed out, promoted, next due ms or -1,
        messages waiting in the dead-letter outbox)."""
        t, c = TopicKeys.of(topic), ChannelKeys.of(topic, channel)
        return Op("scan",
                  [c.queue, c.inflight, c.msgs, c.deferred, c.meta, t.due, c.dead, t.version,
                   c.urgent],
                  [channel, t.wake, limit, self.node(topic)], tuple)

    def scan(self, topic: str, channel: str, limit: int = 1000) -> tuple:
        return self.run(self.scan_op(topic, channel, limit))


class Service:
    """One job of the Store beside its data path. It is given that data path, whose
    client, runner and caches (partition counts, channel lists, order rules) all the
    Store's services share, so what one learns the others know; `redis` is the client
    it reads and writes with."""

    def __init__(self, store: DataPath) -> None:
        self.store = store
        self.redis = store.redis
