"""The Store's history of topics with retention (lib/history.lua): the settings, the
trim, what each part retains, and the calls that replay a range of it into a channel.
A part's history is a Redis Stream of entries "<ms>-<count>" in publish order, so a
range by time is native and one by message id is found by bisection on the time."""

import datetime
from typing import Iterator, NamedTuple, Sequence

from relay.errors import RelayError
from relay.store.data_path import DataPath
from relay.store.keys import ChannelKeys, TopicKeys, id_part, part_name
from relay.store.runner import Op

TRIM_STEP = 1000        # entries a trim by size reads at most per call
REPLAY_CHUNK = 1000     # entries a replay call reads at most
READ_CHUNK = 1000       # entries a read of a range (history_records) takes per call
RETENTION_FIELDS = ("retention_ms", "retention_bytes")
STATE_FIELDS = ("history_added", "history_start", "history_first_ms", "history_last_ms")


class ReplayRefused(RelayError):
    """Nothing to replay: the topic keeps no history (`kept` False), or retains nothing
    of the range."""

    def __init__(self, message: str, kept: bool):
        super().__init__(message)
        self.kept = kept


def no_history(topic: str) -> ReplayRefused:
    """The refusal of a read or replay of a topic whose retention is off."""
    return ReplayRefused(f"topic {topic} keeps no history: retention is off "
                         f"(relay-admin retention {topic} --time 24h turns it on)", False)


class ReplayPlan(NamedTuple):
    """A replay resolved against what is retained: operations.replay's `params`, the
    messages it covers (`size`), the oldest ms retained and whether the range asked for
    starts before it (`clipped`: what is kept is replayed)."""

    params: dict
    size: int
    oldest_ms: int
    clipped: bool


def iso_ms(ms: int) -> str:
    """A ms timestamp as UTC ISO 8601, to the ms."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


class Retained(NamedTuple):
    """What one part's history holds: entries, record bytes, its oldest and newest
    entries' ms (None when empty)."""

    entries: int
    bytes: int
    oldest_ms: int | None
    newest_ms: int | None


class Replayed(NamedTuple):
    """One replay.lua call: messages queued, skipped (in flight or deferred), entries
    read and the last one's id ('' if none)."""

    replayed: int
    skipped: int
    read: int
    last: str

    @classmethod
    def parse(cls, reply) -> "Replayed | None":
        if reply is None:
            return None
        last = reply[3].decode() if isinstance(reply[3], bytes) else str(reply[3])
        return cls(int(reply[0]), int(reply[1]), int(reply[2]), last)


def entry_count(entry_id: bytes | str) -> int:
    """The message count an entry's id ends with."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.rpartition("-")[2])


def entry_ms(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])


class History(DataPath):
    """Retention settings, trims and replays of topics' histories."""

    def set_retention(self, topic: str, time_ms: int, max_bytes: int) -> list[Retained]:
        """Retention on every part: entries older than `time_ms` and the oldest past
        `max_bytes` go (0: no limit of that kind; both 0: off, and the history goes),
        at once as far as one trim call per part does. What each part retains after."""
        parts = self.parts(topic, fresh=True)
        for part in parts:
            meta = TopicKeys.of(part).meta
            if time_ms or max_bytes:
                self._guard(lambda: self.redis.hset(meta, mapping={
                    "retention_ms": time_ms, "retention_bytes": max_bytes}))
            else:
                self._guard(self.redis.hdel, meta, *RETENTION_FIELDS)
        for reply in self.run_many([self.trim_op(part) for part in parts]):
            if isinstance(reply, Exception):
                raise reply
        return self.retained(topic)

    def retention_report(self, topic: str) -> dict:
        """The topic's retention and what each part retains, as relay-admin retention
        --json and /topic/retention show them."""
        time_ms, max_bytes = self.retention(topic)
        return {"topic": topic, "on": bool(time_ms or max_bytes), "time_ms": time_ms,
                "max_bytes": max_bytes,
                "partitions": [{"partition": i, "retained": p.entries, "bytes": p.bytes,
                                "oldest": iso_ms(p.oldest_ms) if p.oldest_ms else None,
                                "newest": iso_ms(p.newest_ms) if p.newest_ms else None}
                               for i, p in enumerate(self.retained(topic))]}

    def retention(self, topic: str) -> tuple[int, int]:
        """(time ms, max bytes) of the topic (part 0's settings); (0, 0) when off."""
        values = self._guard(self.redis.hmget, TopicKeys.of(topic).meta, *RETENTION_FIELDS)
        return int(values[0] or 0), int(values[1] or 0)

    def trim_op(self, part: str, step: int = TRIM_STEP) -> Op:
        """Trim one part's history as its settings say (trim.lua): (trimmed, left,
        bytes, oldest ms or -1)."""
        t = TopicKeys.of(part)
        return Op("trim", [t.meta, t.history], [step], lambda r: tuple(int(n) for n in r))

    def trim_parts(self, parts: Sequence[str]) -> int:
        """trim_op on each part (the scanner's sweep): the entries trimmed."""
        trimmed = 0
        for reply in self.run_many([self.trim_op(part) for part in parts]):
            if isinstance(reply, Exception):
                raise reply
            trimmed += reply[0]
        return trimmed

    def retained(self, topic: str) -> list[Retained]:
        """What each part of the topic retains, in part order."""
        return self.retained_parts(self.parts(topic))

    def retained_parts(self, parts: Sequence[str]) -> list[Retained]:
        """What each of `parts` (of any topics) retains, in their order: one pipeline
        whatever their number, so /stats reads every topic's in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for part in parts:
            t = TopicKeys.of(part)
            pipe.hmget(t.meta, *STATE_FIELDS)
            pipe.xlen(t.history)
        replies = self._guard(pipe.execute)
        out = []
        for state, count in zip(replies[::2], replies[1::2]):
            added, start, first, last = (int(v) if v is not None else None for v in state)
            out.append(Retained(count, (added or 0) - (start or 0) if count else 0,
                                first if count else None, last if count else None))
        return out

    def history_records(self, part: str, from_ms: int | None = None, to_ms: int | None = None,
                        chunk: int = READ_CHUNK) -> Iterator[list[bytes]]:
        """The records one part retains from `from_ms` to `to_ms` (both inclusive, on the
        entries' ms; None: the oldest, the newest), in publish order, as queued
        (relay/codec.py parse_record), a list per read of at most `chunk` entries: how
        readers outside any channel (the Spark source) see a history, so the entries'
        layout is decoded here only."""
        history = TopicKeys.of(part).history
        low = "-" if from_ms is None else f"{from_ms}-0"
        high = "+" if to_ms is None else str(to_ms)
        while True:
            entries = self._guard(lambda: self.redis.xrange(history, low, high, count=chunk))
            if entries:
                yield [fields[b"r"] for _, fields in entries]
            if len(entries) < chunk:
                return
            last = entries[-1][0]
            low = "(" + (last.decode() if isinstance(last, bytes) else last)

    def replay_op(self, part: str, channel: str, start: str, end: str, forward: bool = True,
                  cut: int = 0, count: int = REPLAY_CHUNK) -> Op:
        """One replay.lua call: a Replayed, or None if the channel does not exist."""
        t, c = TopicKeys.of(part), ChannelKeys.of(part, channel)
        return Op("replay", [t.history, c.queue, c.msgs, c.meta, t.channels, t.version],
                  [channel, start, end, count, int(forward), cut, t.wake, self.node(part)],
                  Replayed.parse)

    def range_size(self, part: str, start: str, end: str, cut: int = 0) -> int:
        """The entries of a part's history from `start` to `end` (stream ids), at most
        `cut` by count (0: any): exact unless retention was off for a while in between
        (counts are consecutive), then an upper bound."""
        history = TopicKeys.of(part).history
        pipe = self.redis.pipeline(transaction=False)
        pipe.xrange(history, start, end, count=1)
        pipe.xrevrange(history, end, start, count=1)
        first, last = self._guard(pipe.execute)
        if not first:
            return 0
        low, high = entry_count(first[0][0]), entry_count(last[0][0])
        if cut:
            high = min(high, cut)
        return max(0, high - low + 1)

    def id_start(self, topic: str, msg_id: str) -> tuple[int, bool] | None:
        """(ms, clipped) of the entry of message `msg_id` in its part, or of the first one
        after it (clipped: the message itself is older than what is kept); None if its
        part retains nothing from it on. Ids and times grow together, so a bisection on
        the time finds it in about 40 reads."""
        index = id_part(msg_id.encode())
        history = TopicKeys.of(part_name(topic, index)).history
        wanted = int(msg_id[4:], 16)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xrange(history, "-", "+", count=1)
        pipe.xrevrange(history, "+", "-", count=1)
        first, last = self._guard(pipe.execute)
        if not first or entry_count(last[0][0]) < wanted:
            return None
        clipped = entry_count(first[0][0]) > wanted
        low, high = entry_ms(first[0][0]), entry_ms(last[0][0])
        while low < high:   # the first ms holding an entry of count >= wanted
            middle = (low + high) // 2
            upto = self._guard(lambda: self.redis.xrevrange(history, str(middle), "-", count=1))
            if upto and entry_count(upto[0][0]) >= wanted:
                high = middle
            else:
                low = middle + 1
        return low, clipped

    def plan_replay(self, topic: str, from_ms: int | None = None, to_ms: int | None = None,
                    from_id: str | None = None) -> ReplayPlan:
        """The replay of the topic's history from `from_ms` or message `from_id` (else
        the oldest retained) to `to_ms` (else the newest), per part; ReplayRefused if
        the topic keeps no history or retains nothing of that range."""
        kept = [r for r in self.retained(topic) if r.entries]
        if not kept:
            if self.retention(topic) == (0, 0):
                raise no_history(topic)
            raise ReplayRefused(f"topic {topic} retains no message yet", False)
        oldest = min(r.oldest_ms for r in kept if r.oldest_ms is not None)
        newest = max(r.newest_ms for r in kept if r.newest_ms is not None)
        parts = self.parts(topic)
        clipped = from_ms is not None and from_ms < oldest
        starts = ["-" if from_ms is None else f"{from_ms}-0"] * len(parts)
        if from_id is not None:
            index = id_part(from_id.encode())
            found = self.id_start(topic, from_id) if 0 <= index < len(parts) else None
            if found is None:
                raise ReplayRefused(f"message {from_id} is not retained by topic {topic}, "
                                    f"nor any after it in its partition", True)
            from_ms, clipped = found
            starts = [f"{from_ms}-0"] * len(parts)
            starts[index] = f"{from_ms}-{int(from_id[4:], 16)}"
        if (to_ms is not None and to_ms < oldest) or (from_ms is not None and from_ms > newest):
            asked = f"{iso_ms(from_ms) if from_ms is not None else 'the start'} to " \
                    f"{iso_ms(to_ms) if to_ms is not None else 'now'}"
            raise ReplayRefused(f"topic {topic} retains nothing from {asked}: it retains "
                                f"{iso_ms(oldest)} to {iso_ms(newest)}", True)
        end = "+" if to_ms is None else str(to_ms)
        size = sum(self.range_size(p, start, end) for p, start in zip(parts, starts))
        return ReplayPlan({"starts": starts, "end": end}, size, oldest, clipped)

    def create_from_start(self, topic: str, channel: str,
                          from_ms: int | None = None) -> ReplayPlan | None:
        """Create a channel that starts with everything the topic retains (from
        `from_ms` on, if given): subscribe.lua on each part gives the cut (its last
        message not in the backlog), and the replay puts what is retained up to it
        before what was published since. None if the channel exists already."""
        joined = self.run_many([self.subscribe_op(part, channel, "")
                                for part in self.parts(topic)])
        for reply in joined:
            if isinstance(reply, Exception):
                raise reply
        if not joined[0].created:
            return None
        cuts = [j.cut for j in joined]
        parts = self.parts(topic)
        start = "-" if from_ms is None else f"{from_ms}-0"
        oldest = min((r.oldest_ms for r in self.retained(topic) if r.oldest_ms is not None),
                     default=0)
        size = sum(self.range_size(p, start, "+", cut) for p, cut in zip(parts, cuts) if cut)
        return ReplayPlan({"starts": [start] * len(parts), "end": "+", "cuts": cuts}, size,
                          oldest, from_ms is not None and from_ms < oldest)
