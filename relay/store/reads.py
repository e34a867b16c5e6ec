"""The Store's reads of queue state, used by the HTTP /stats and /metrics of brokers and
by relay-admin (counts per topic and channel), by the scanner and reaper (due channels,
from the node due indexes, and their seeding; stored parts, consumers' brokers) and by
a broker's wake-ups (topic versions, from the node news hashes; channel states)."""

import functools
import time
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import redis

from relay.codec import MAX_PRIORITY
from relay.store import keys, nodes, resp
from relay.store.base import Confirmed
from relay.store.causes import REFUSALS, cause
from relay.store.data_path import DataPath, Service
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.replies import DueView, summed
from relay.store.runner import Op, guarded

DUE_READ = 10_000   # entries of one node's due index read at most per pass
SEED_CHUNK = 500    # parts per seed.lua call
READ_BATCH = 250    # topics or channels per pipeline of /stats: others wait while one is parsed
CHANNEL_READS = 8   # commands of a channel part's figures (channel_reads)
NEWS_KEPT = 64      # news replies kept to compare the next with (32,000 parts in slices of 500)


class NewsReply:
    """A node news hash's reply for a group of parts, the versions taken from it, and
    when it confirmed their topics' partition counts."""

    def __init__(self, reply: list, versions: dict, confirmed: Confirmed) -> None:
        self.reply, self.versions, self.confirmed = reply, versions, confirmed


class Reads(Service):
    """What is stored, read without changing it."""

    def __init__(self, store: DataPath) -> None:
        super().__init__(store)
        self._counted: dict[str, int] = {}     # topic -> its news when its count was read
        self._news_replies: dict[tuple, NewsReply] = {}     # parts -> their last news

    def refusal(self) -> str | None:
        """Why Redis refuses writes now (out of memory, persistence failing, a read-only
        replica: causes.py), found by a write that changes nothing on each node (SET XX
        of a key that never exists), or why it refused this process' last publish if
        none took since (causes.Refusals); None while it takes them."""
        pipe = self.redis.pipeline(transaction=False)
        for prefix in self.store.nodes.prefixes():
            pipe.set(keys.nothing_key(prefix + nodes.NEWS), "", xx=True)
        for reply in guarded(lambda: pipe.execute(raise_on_error=False)):
            if isinstance(reply, Exception):
                return cause(reply)
        return REFUSALS.recent()

    def due_channels(self, now: int | None = None, limit: int = DUE_READ) -> "DueView":
        """The (part, channel, due ms) entries of the node due indexes (nodes.py) due by
        Redis time `now` (ms, read if None): one ZRANGEBYSCORE per node, whatever the
        number of topics, of at most `limit` entries (`more` if a node had that many).
        An entry found in another node's index than its part's (slots moved) is taken
        out of it and its part seeded where it is now (seed_due). The nodes whose read
        failed are counted in `failed`: their entries wait for the next pass."""
        now = self.store.now_ms() if now is None else now  # a cluster pipeline takes no TIME
        prefixes = self.store.nodes.prefixes()
        pipe = self.redis.pipeline(transaction=False)
        for prefix in prefixes:
            pipe.zrangebyscore(prefix + nodes.DUE, "-inf", now, start=0, num=limit,
                               withscores=True)
        replies = guarded(lambda: pipe.execute(raise_on_error=False))
        due, more, failed, strays = [], False, 0, []
        for prefix, reply in zip(prefixes, replies):
            if isinstance(reply, Exception):
                failed += 1
                continue
            more = more or len(reply) == limit
            for member, score in reply:
                part, channel = nodes.split_member(member)
                if self.store.cluster and self.store.nodes.prefix(part) != prefix:
                    strays.append((prefix, member, part))
                else:
                    due.append((part, channel, int(score)))
        if strays:
            self._move_strays(strays)
        if failed and self.store.cluster:
            self.store.runner.refresh_slots()
        return DueView(now, due, more, failed)

    def _move_strays(self, strays: list) -> None:
        """Entries of parts another node serves now: out of the index they are in, and
        their parts seeded in their own node's."""
        pipe = self.redis.pipeline(transaction=False)
        for prefix, member, _ in strays:
            pipe.zrem(prefix + nodes.DUE, member)
        guarded(lambda: pipe.execute(raise_on_error=False))
        self.seed_due(sorted({part for _, _, part in strays}))

    def seed_due(self, parts: Sequence[str], chunk: int = SEED_CHUNK) -> int:
        """Every entry of the parts' due indexes added to their node's due index where it
        is not there lower (seed.lua, one call per node and `chunk` parts): what a write
        sent to a stale node's keys missed, or a restarted Redis or a lost key lacks.
        Returns the entries seen; raises the first call's error."""
        ops = [Op("seed", [prefix + nodes.DUE], [TopicKeys.of(p).due for p in group[i:i + chunk]])
               for prefix, group in self.store.nodes.by_node(parts).items()
               for i in range(0, len(group), chunk)]
        seen = 0
        for reply in self.store.run_many(ops):
            if isinstance(reply, Exception):
                raise reply
            seen += int(reply)
        return seen

    def versions(self, topics: Sequence[str]) -> dict:
        """topic (or part) -> its version (news.lua; 0 while it has none) for those read:
        one HMGET of the node news hash per node (nodes.py), whatever the number of
        topics. The parts it has no field for are read from their version keys
        (versions.lua, one call per node, which sets their field), as are topics whose
        news moved since their partition count was read (raising it is news): the
        partition counts and placements read are learned, the others confirmed. The
        topics of a read that failed are left out, for the next one."""
        groups = self.store.nodes.by_node(topics)
        if type(self.redis) is redis.Redis:     # one server: the same HMGET each second
            reads = [news_read(prefix + nodes.NEWS, tuple(group))
                     for prefix, group in groups.items()]
            (replies,) = guarded(list, self._read_pipelines([reads]))
        else:
            pipe = self.redis.pipeline(transaction=False)
            for prefix, group in groups.items():
                pipe.hmget(prefix + nodes.NEWS, group)
            replies = guarded(lambda: pipe.execute(raise_on_error=False))
        read: dict = {}
        fallback = []
        now = time.monotonic()
        for group, reply in zip(groups.values(), replies):
            if isinstance(reply, Exception):
                if self.store.cluster:
                    self.store.runner.refresh_slots()
                continue
            fallback += self._took_news(group, reply, read, now)
        if fallback:
            self._read_versions(fallback, read)
        return read

    def _took_news(self, group: list[str], reply: list, read: dict, now: float) -> list[str]:
        """The versions of one node's news reply for the group into `read`; returns the
        parts to read from their version keys. A reply the same as the group's last one,
        which needed none, only confirms its counts again: at 5,000 idle topics the work
        per topic was a fifth of the broker's CPU."""
        key = tuple(group)
        last = self._news_replies.pop(key, None)
        if last is not None and last.reply == reply:
            last.confirmed.at = now
            read.update(last.versions)
            self._news_replies[key] = last
            return []
        confirmed, versions, fallback = Confirmed(now), {}, []
        for topic, news in zip(group, reply):
            if news is None:
                fallback.append(topic)
                continue
            versions[topic] = int(news)
            if keys.PART_MARK in topic:
                continue
            if self.store.knows(topic) and self._counted.get(topic) == versions[topic]:
                self.store.confirm(topic, confirmed)      # no news since its count was read
            else:
                fallback.append(topic)
        read.update(versions)
        if not fallback:
            self._keep_news(key, NewsReply(reply, versions, confirmed))
        return fallback

    def _keep_news(self, key: tuple, news: NewsReply) -> None:
        """The group's last news reply, the least recently read dropped past NEWS_KEPT."""
        if len(self._news_replies) >= NEWS_KEPT:
            del self._news_replies[next(iter(self._news_replies))]
        self._news_replies[key] = news

    def _read_versions(self, topics: list[str], read: dict) -> None:
        """versions() of topics from their version keys, into `read`."""
        groups = self.store.nodes.by_node(topics)
        ops = [Op("versions", [prefix + nodes.NEWS], [TopicKeys.of(t).version for t in group])
               for prefix, group in groups.items()]
        for group, reply in zip(groups.values(), self.store.run_many(ops)):
            if isinstance(reply, Exception):
                if self.store.cluster:
                    self.store.runner.refresh_slots()
                for topic in group:
                    read.pop(topic, None)
                continue
            for topic, news, partitions, salts, rule, priority_rule in zip(
                    group, reply[::5], reply[1::5], reply[2::5], reply[3::5], reply[4::5]):
                read[topic] = int(news or 0)
                if keys.PART_MARK not in topic:
                    self.store.learn_partitions(topic, int(partitions or 1), (salts or b"").decode(),
                                                (rule or b"").decode(),
                                                (priority_rule or b"").decode())
                    self._counted[topic] = read[topic]

    def channel_states(self, channels: Sequence[tuple]) -> list:
        """(incarnation or None if the channel is gone, empties) of each (topic, channel):
        what subscribe.lua returned, as it is now."""
        pipe = self.redis.pipeline(transaction=False)
        for topic, channel in channels:
            pipe.hmget(ChannelKeys.of(topic, channel).meta, "incarnation", "empties")
        return [(int(i) if i is not None else None, int(e or 0))
                for i, e in guarded(pipe.execute)]

    def topic_names(self) -> list[str]:
        return sorted(n.decode() for n in guarded(self.redis.smembers, keys.TOPICS))

    def stored_parts(self) -> list[str]:
        """The parts of every registered topic (a topic of one partition is its own):
        what scanners and reapers walk."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.smembers(keys.TOPICS)
        pipe.smembers(keys.PARTITIONS)
        topics, parts = guarded(pipe.execute)
        return sorted(n.decode() for n in topics | parts)

    def channel_names(self, topic: str) -> list[str]:
        names = guarded(self.redis.smembers, TopicKeys.of(topic).channels)
        return sorted(n.decode() for n in names)

    def consumer_brokers(self, topics: Sequence[str]) -> set[str]:
        """The broker ids counted among the consumers of the topics' channels."""
        pipe = self.redis.pipeline(transaction=False)
        for topic in topics:
            pipe.smembers(TopicKeys.of(topic).channels)
        channels = [(t, c.decode()) for t, names in zip(topics, guarded(pipe.execute))
                    for c in names]
        for topic, channel in channels:
            pipe.hkeys(ChannelKeys.of(topic, channel).consumers)
        return {b.decode() for ids in guarded(pipe.execute) for b in ids}

    def read_topic(self, topic: str, parts: list | None = None) -> dict:
        """Depth and counters of a topic as stored, summed over its parts (or `parts`);
        paused as part 0 is."""
        return summed(self.read_topic_parts(topic, parts))

    def read_topic_parts(self, topic: str, parts: list | None = None) -> list[dict]:
        return self.read_topic_state(topic, parts)[0]

    def read_topic_state(self, topic: str, parts: list | None = None
                         ) -> tuple[list[dict], tuple[int, int]]:
        """read_topic_parts, and the topic's retention (time ms, max bytes; (0, 0) when
        off) as part 0's meta has it, from the same read: so /stats reads the history
        of the topics with retention on only, at no cost for the others."""
        figures, retention, _ = self.read_topic_states([(topic, parts or self.store.parts(topic))])[0]
        return figures, retention

    def read_topic_states(self, topics: Sequence[tuple[str, list[str]]]
                          ) -> list[tuple[list[dict], tuple[int, int], list[str]]]:
        """read_topic_state of each (topic, its parts), with its channels' names, in
        pipelines of READ_BATCH topics: /stats reads thousands in a few round trips."""
        def send(commands: list, topic: str, parts: list[str]) -> None:
            for part in parts:
                t = TopicKeys.of(part)
                commands += [("HGETALL", t.meta), ("LLEN", t.backlog),
                             ("ZCARD", t.backlog_deferred)]
            commands.append(("SMEMBERS", TopicKeys.of(topic).channels))

        def take(replies: Iterator, topic: str, parts: list[str]) -> tuple:
            figures = [(pairs(next(replies)), next(replies), next(replies)) for _ in parts]
            first = figures[0][0]
            retention = (int(first.get(b"retention_ms") or 0),
                         int(first.get(b"retention_bytes") or 0))
            return ([{"message_count": int(meta.get(b"message_count", 0)),
                      "message_bytes": int(meta.get(b"message_bytes", 0)),
                      "depth": backlog, "deferred_count": deferred,
                      "paused": b"paused" in meta}
                     for meta, backlog, deferred in figures], retention,
                    sorted(n.decode() for n in next(replies)))
        return self._batched(topics, send, take)

    def _batched(self, items: Sequence[tuple], send: Callable[..., None],
                 take: Callable[..., Any], width: int = 1) -> list:
        """take(replies, *item) of each item, from the replies to the commands
        send(commands, *item) added for it, in pipelines of READ_BATCH items; with a
        `width`, `replies` gives tuples of that many replies."""
        batches = [items[start:start + READ_BATCH] for start in range(0, len(items), READ_BATCH)]
        pipelines = []
        for batch in batches:
            commands: list = []
            for item in batch:
                send(commands, *item)
            pipelines.append(commands)
        return guarded(self._taken, batches, self._read_pipelines(pipelines), take, width)

    @staticmethod
    def _taken(batches: list, replied: Iterator[list], take: Callable[..., Any],
               width: int) -> list:
        """Each batch's items taken from its replies; `replied` is zipped first, so that
        it runs to its end and frees its connection."""
        out = []
        for replies, batch in zip(replied, batches):
            each = iter(replies)
            rows = each if width == 1 else zip(*[each] * width)
            out += [take(rows, *item) for item in batch]
        return out

    def _read_pipelines(self, pipelines: list[list]) -> Iterator[list]:
        """The replies to each pipeline of read-only commands (a tuple each, or Packed),
        one pipeline's at a time. On one server they are packed and read in RESP directly
        (resp.py), as redis-py's pipeline code was 80% of /stats' time with thousands of
        channels (BENCHMARKS.md), and the next pipeline is sent before this one's replies
        are read: Redis answers it while the caller takes these. Else through redis-py
        (a cluster's nodes, fakeredis). An error reply raises."""
        if type(self.redis) is not redis.Redis:
            for commands in pipelines:
                pipe = self.redis.pipeline(transaction=False)
                for command in commands:
                    for each in command.commands if isinstance(command, Packed) else (command,):
                        pipe.execute_command(*each)
                yield pipe.execute()
            return
        pool = self.redis.connection_pool
        conn = pool.get_connection()
        try:
            reader = resp.Replies(conn)
            if pipelines:
                conn.send_packed_command([_packed(pipelines[0])])
            for sent, commands in enumerate(pipelines, 1):
                if sent < len(pipelines):
                    conn.send_packed_command([_packed(pipelines[sent])])
                replies = reader.read(sum(len(c.commands) if isinstance(c, Packed) else 1
                                          for c in commands))
                if reader.errors.count:     # else none of them is one
                    for reply in replies:
                        if isinstance(reply, Exception):
                            raise reply
                yield replies
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    def read_channel(self, topic: str, channel: str) -> dict:
        """Depth, in-flight, deferred and counters of a channel as stored, summed over
        the topic's parts; consumers and paused as part 0 has them (every part counts
        the same consumers)."""
        return summed(self.read_channel_parts(topic, channel))

    def read_channel_parts(self, topic: str, channel: str) -> list[dict]:
        """read_channel of each part."""
        return self.read_channels([(self.store.parts(topic), channel)])[0]

    def read_channels(self, channels: Sequence[tuple[list[str], str]]) -> list[list[dict]]:
        """read_channel_parts of each (its topic's parts, channel), in pipelines of
        READ_BATCH channels."""
        def send(commands: list, parts: list[str], channel: str) -> None:
            commands += [channel_reads(part, channel) for part in parts]

        def take(rows: Iterator, parts: list[str], channel: str) -> list[dict]:
            return [_channel_figures(*next(rows)) for _ in parts]
        return self._batched(channels, send, take, width=CHANNEL_READS)

    def urgent_depths(self, channels: Sequence[tuple[str, str]]) -> list[dict[int, int]]:
        """The messages of each priority 1-9 ready in each (topic, channel), over its
        parts (lib/queue.lua): {priority: count}, highest first."""
        c_parts = [[ChannelKeys.of(part, channel) for part in self.store.parts(topic)]
                   for topic, channel in channels]
        pipe = self.redis.pipeline(transaction=False)
        for keys_ in c_parts:
            for c in keys_:
                pipe.hgetall(c.urgent)
        counts = iter(guarded(pipe.execute))
        out = []
        for keys_ in c_parts:
            found: dict[int, int] = {}
            for _ in keys_:
                for priority, n in next(counts).items():
                    found[int(priority)] = found.get(int(priority), 0) + int(n)
            out.append(dict(sorted(found.items(), reverse=True)))
        return out

    def queued_records(self, topic: str, channel: str, chunk: int):
        """The channel's ready messages (its urgent ones, highest priority first, then its
        queue's), `chunk` records at a time, without taking them."""
        for part in self.store.parts(topic):
            c = ChannelKeys.of(part, channel)
            lists = [c.urgent_list(p) for p in range(MAX_PRIORITY, 0, -1)] + [c.queue]
            for name in lists:
                start = 0
                while records := guarded(self.redis.lrange, name, start, start + chunk - 1):
                    yield records
                    start += chunk

    def channel_setting(self, topic: str, channel: str, name: str) -> str | None:
        value = guarded(self.redis.hget, ChannelKeys.of(topic, channel).meta, name)
        return value.decode() if value is not None else None


class Packed(NamedTuple):
    """Commands, with their RESP made once (channel_reads)."""
    commands: tuple
    data: bytes


@functools.lru_cache(maxsize=16384)
def channel_reads(part: str, channel: str) -> Packed:
    """The reads of a channel part's figures (read_channels), packed once: packing 7
    commands for each of 5,000 channels was a third of /stats' time."""
    c = ChannelKeys.of(part, channel)
    commands = (("LLEN", c.queue), ("ZCARD", c.waiting), ("HLEN", c.gate),
                ("ZCARD", c.inflight), ("ZCARD", c.deferred), ("HGETALL", c.meta),
                ("HVALS", c.consumers), ("HVALS", c.urgent))
    return Packed(commands, resp.pack(commands))


@functools.lru_cache(maxsize=64)
def news_read(news: str, parts: tuple[str, ...]) -> Packed:
    """The HMGET of the parts' fields of a node news hash, packed once for as long as a
    broker follows the same parts: at 5,000 topics, packing it each second was a sixth
    of an idle broker's CPU. The broker reads its parts in slices (wakeups.CHECK_SLICE):
    the cache holds those of 32,000 parts."""
    command = ("HMGET", news, *parts)
    return Packed((command,), resp.pack((command,)))


def _packed(commands: list) -> bytes:
    return b"".join(c.data if isinstance(c, Packed) else resp.pack((c,)) for c in commands)


def pairs(reply: Any) -> dict:
    """An HGETALL reply as a dict: redis-py's already is, RESP's is a flat list."""
    if isinstance(reply, dict):
        return reply
    each = iter(reply)
    return dict(zip(each, each))


def _channel_figures(queued: int, waiting: int, keys_out: int, inflight: int, deferred: int,
                     meta: Any, consumers: list, urgent: list) -> dict:
    """A channel part's figures from its LLEN, ZCARDs, HLEN of the order gate, meta and
    consumers' counts: the depth counts the messages of priority 1-9 (lib/queue.lua) and
    the messages of an ordered channel waiting behind
    their keys, which order_waiting counts alone, beside whether it is ordered and its
    keys with a message out (queued, in flight or deferred: order_keys_out), and its
    delivery rate limit in msgs/s (rate_limit, None without one)."""
    meta = pairs(meta)
    waiting += int(meta.get(b"order_waiting", 0))      # numbered in msgs (lib/order.lua)
    inflight += int(meta.get(b"lotted", 0))            # in lots beyond one each (lib/inflight.lua)
    return {"depth": queued + sum(map(int, urgent)) + waiting, "in_flight_count": inflight, "deferred_count": deferred,
            "message_count": int(meta.get(b"message_count", 0)),
            "requeue_count": int(meta.get(b"requeue_count", 0)),
            "timeout_count": int(meta.get(b"timeout_count", 0)),
            "dead_count": int(meta.get(b"dead_count", 0)),
            "deleted_count": int(meta.get(b"deleted_count", 0)),
            "expired_count": int(meta.get(b"expired_count", 0)),
            "overflow_count": int(meta.get(b"overflow_count", 0)),
            "client_count": sum(map(int, consumers)), "paused": b"paused" in meta,
            "ordered": b"ordered" in meta, "order_keys_out": keys_out, "order_waiting": waiting,
            "rate_limit": float(meta[b"rate_per_s"]) if b"rate_per_s" in meta else None}
