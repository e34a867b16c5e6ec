"""The Store's reads of queue state, used by the HTTP /stats and /metrics of brokers and
by relay-admin (counts per topic and channel), by the scanner and reaper (due channels,
stored parts, consumers' brokers) and by a broker's wake-ups (topic versions, channel
states)."""

from typing import Sequence

from relay.store import keys
from relay.store.base import StoreBase
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.replies import DueView, summed
from relay.store.runner import Op


class Reads(StoreBase):
    """What is stored, read without changing it."""

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

    def queued_records(self, topic: str, channel: str, chunk: int):
        """The channel's ready queues, `chunk` records at a time, without taking them."""
        for part in self.parts(topic):
            queue, start = ChannelKeys.of(part, channel).queue, 0
            while records := self._guard(self.redis.lrange, queue, start, start + chunk - 1):
                yield records
                start += chunk

    def channel_setting(self, topic: str, channel: str, name: str) -> str | None:
        value = self._guard(self.redis.hget, ChannelKeys.of(topic, channel).meta, name)
        return value.decode() if value is not None else None
