"""The Store's history of topics with retention (lib/history.lua): the settings, the
trim, what each part retains, and the calls that replay a range of it into a channel.
A part's history is a Redis Stream of entries "<ms>-<count>" in publish order, each the
records of one publish call from the message of that count on, so a range by time is
native and one by message id is found by bisection on the time."""

import datetime
from typing import Iterator, NamedTuple, Sequence

from relay.errors import RelayError
from relay.store.data_path import Service
from relay.store.keys import ChannelKeys, TopicKeys, id_part
from relay.store.runner import Op, guarded

TRIM_ENTRIES = 10_000   # entries a trim call removes at most (trim.lua)
TRIM_BYTES = 4 << 20    # about the most record bytes it removes (and a trim by size reads)
REPLAY_CHUNK = 1000     # messages a replay call reads (whole entries: about as many)
READ_CHUNK = 1000       # about the messages a read of a range (history_records) takes per call
RETENTION_FIELDS = ("retention_ms", "retention_bytes")
STATE_FIELDS = ("history_messages", "history_start_messages", "history_bytes",
                "history_start_bytes", "history_first_ms", "history_last_ms")


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
    """What one part's history holds: `entries` the messages retained (not the stream's
    entries, which hold a publish call's messages each: the name is from when each
    message had its own), their records' bytes, its oldest and newest entries' ms (None
    when empty)."""

    entries: int
    bytes: int
    oldest_ms: int | None
    newest_ms: int | None


class Replayed(NamedTuple):
    """One replay.lua call: messages queued, skipped (in flight or deferred), messages
    read, the last entry's id ('' if none) and whether the range is done."""

    replayed: int
    skipped: int
    read: int
    last: str
    ended: bool

    @classmethod
    def parse(cls, reply) -> "Replayed | None":
        if reply is None:
            return None
        last = reply[3].decode() if isinstance(reply[3], bytes) else str(reply[3])
        return cls(int(reply[0]), int(reply[1]), int(reply[2]), last, bool(reply[4]))

    @classmethod
    def handed_back(cls, reply) -> "tuple[Replayed, list[bytes]] | None":
        """A call that handed its records back (replay_op's `hand_back`): the Replayed
        (none queued) and the records not skipped."""
        done = cls.parse(reply)
        return None if done is None else (done, list(reply[5]))


class Trimmed(NamedTuple):
    """One trim.lua call: messages trimmed, left, their bytes, the oldest entry's ms (-1
    if none) and whether more may be left to trim (the call's budget ran out)."""

    trimmed: int
    left: int
    bytes: int
    oldest_ms: int
    more: bool

    @classmethod
    def parse(cls, reply) -> "Trimmed":
        return cls(int(reply[0]), int(reply[1]), int(reply[2]), int(reply[3]), bool(reply[4]))


class Span(NamedTuple):
    """An entry's ms and the counts of its first and last messages."""

    ms: int
    first: int
    last: int

    @classmethod
    def of(cls, entry) -> "Span":
        """From an entry as XRANGE gives it: (id, {r: records, l: their lengths})."""
        entry_id, fields = entry
        text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        ms, _, first = text.partition("-")
        return cls(int(ms), int(first), int(first) + fields[b"l"].count(b" "))


def entry_records(fields: dict) -> list[bytes]:
    """An entry's records (its fields as XRANGE gives them: r the records one after the
    other, l their lengths)."""
    records, at, blob = [], 0, fields[b"r"]
    for length in map(int, fields[b"l"].split(b" ")):
        records.append(blob[at:at + length])
        at += length
    return records


def position(stream_id: str) -> tuple[int, int] | None:
    """(ms, count) of a message position "<ms>-<count>"; None for other ids."""
    ms, dash, count = stream_id.partition("-")
    return (int(ms), int(count)) if dash and ms.isdigit() and count.isdigit() else None


class History(Service):
    """Retention settings, trims and replays of topics' histories."""

    def set_retention(self, topic: str, time_ms: int, max_bytes: int) -> list[Retained]:
        """Retention on every part: messages older than `time_ms` and the oldest past
        `max_bytes` go (0: no limit of that kind; both 0: off, and the history goes),
        at once, in trim calls of a bounded cost. What each part retains after."""
        parts = self.store.parts(topic, fresh=True)
        for part in parts:
            meta = TopicKeys.of(part).meta
            if time_ms or max_bytes:
                guarded(lambda: self.redis.hset(meta, mapping={
                    "retention_ms": time_ms, "retention_bytes": max_bytes}))
            else:
                guarded(self.redis.hdel, meta, *RETENTION_FIELDS)
        self.trim_parts(parts)
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
        values = guarded(self.redis.hmget, TopicKeys.of(topic).meta, *RETENTION_FIELDS)
        return int(values[0] or 0), int(values[1] or 0)

    def trim_op(self, part: str, entries: int = TRIM_ENTRIES, max_bytes: int = TRIM_BYTES) -> Op:
        """One step of the trim of a part's history as its settings say (trim.lua): at
        most `entries` entries and about `max_bytes` read: a Trimmed."""
        t = TopicKeys.of(part)
        return Op("trim", [t.meta, t.history], [entries, max_bytes], Trimmed.parse)

    def trim_parts(self, parts: Sequence[str], seconds: float | None = None) -> int:
        """trim_op on each part, again on those it left more to trim until none does
        or, given `seconds` (the scanner's sweep), until they have passed (the next
        sweep goes on): the messages trimmed (in_rounds)."""
        return self.store.in_rounds(parts, self.trim_op, seconds)

    def retained(self, topic: str) -> list[Retained]:
        """What each part of the topic retains, in part order."""
        return self.retained_parts(self.store.parts(topic))

    def retained_parts(self, parts: Sequence[str]) -> list[Retained]:
        """What each of `parts` (of any topics) retains, in their order: one pipeline
        whatever their number, so /stats reads every topic's in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for part in parts:
            pipe.hmget(TopicKeys.of(part).meta, *STATE_FIELDS)
        out = []
        for state in guarded(pipe.execute):
            added, start, size, size_start, first, last = (int(v or 0) for v in state)
            out.append(Retained(added - start, size - size_start, first, last) if added > start
                       else Retained(0, 0, None, None))
        return out

    def history_records(self, part: str, from_ms: int | None = None, to_ms: int | None = None,
                        chunk: int = READ_CHUNK) -> Iterator[list[bytes]]:
        """The records one part retains from `from_ms` to `to_ms` (both inclusive, on the
        entries' ms; None: the oldest, the newest), in publish order, as queued
        (relay/codec.py parse_record), a list per read of whole entries, about `chunk`
        messages (as many entries as that is at their mean size so far): how readers
        outside any channel (the Spark source) see a history, so the entries' layout is
        decoded here only."""
        history = TopicKeys.of(part).history
        low = "-" if from_ms is None else f"{from_ms}-0"
        high = "+" if to_ms is None else str(to_ms)
        count, entries_read, messages_read = min(chunk, 16), 0, 0
        while True:
            entries = guarded(lambda: self.redis.xrange(history, low, high, count=count))
            records = [record for _, fields in entries for record in entry_records(fields)]
            if records:
                yield records
            if len(entries) < count:
                return
            entries_read, messages_read = entries_read + len(entries), messages_read + len(records)
            count = max(1, min(chunk, chunk * entries_read // messages_read))
            last = entries[-1][0]
            low = "(" + (last.decode() if isinstance(last, bytes) else last)

    def replay_op(self, part: str, channel: str, start: str, end: str, forward: bool = True,
                  cut: int = 0, count: int = REPLAY_CHUNK, hand_back: bool = False) -> Op:
        """One replay.lua call: a Replayed, or None if the channel does not exist. With
        `hand_back` nothing is queued: (a Replayed, the records not skipped), for an
        ordered channel's replay to queue through its gate (workers/operations.py)."""
        t, c = TopicKeys.of(part), ChannelKeys.of(part, channel)
        return Op("replay", [t.history, c.queue, c.msgs, c.meta, t.channels, t.version,
                             c.inflight, c.urgent],
                  [channel, start, end, count, int(forward), cut, t.wake, self.store.node(part),
                   int(hand_back)],
                  Replayed.handed_back if hand_back else Replayed.parse)

    def newest_entry(self, part: str) -> str | None:
        """The id of the newest entry of a part's history, None if it has none."""
        last = guarded(lambda: self.redis.xrevrange(TopicKeys.of(part).history, "+", "-",
                                                        count=1))
        if not last:
            return None
        entry_id = last[0][0]
        return entry_id.decode() if isinstance(entry_id, bytes) else entry_id

    def range_size(self, part: str, start: str, end: str, cut: int = 0) -> int:
        """The messages of a part's history from `start` (a message position
        "<ms>-<count>", maybe inside an entry, or "-") to `end` (a stream id or ms), at
        most `cut` by count (0: any): exact unless retention was off for a while in
        between (counts are consecutive), then an upper bound."""
        history = TopicKeys.of(part).history
        pipe = self.redis.pipeline(transaction=False)
        pipe.xrevrange(history, start, "-", count=1)    # an entry begun before start
        pipe.xrange(history, start, end, count=1)
        pipe.xrevrange(history, end, start, count=1)
        before, first, last = (Span.of(e[0]) if e else None for e in guarded(pipe.execute))
        at = position(start)
        low = high = None
        if before and at and before.ms == at[0] and before.first < at[1] <= before.last \
                and (end == "+" or before.ms <= int(end.partition("-")[0])):
            low, high = at[1], before.last
        if first and low is None:
            low = first.first
        if last:
            high = last.last
        if low is None or high is None:
            return 0
        if cut:
            high = min(high, cut)
        return max(0, high - low + 1)

    def id_start(self, topic: str, msg_id: str) -> tuple[int, bool] | None:
        """(ms, clipped) of the entry holding message `msg_id` in its part, or of the
        first one after it (clipped: the message itself is older than what is kept);
        None if its part retains nothing from it on. Ids and times grow together, so a
        bisection on the time finds it in about 40 reads of one entry."""
        index = id_part(msg_id.encode())
        history = TopicKeys.of(self.store.part(topic, index)).history
        wanted = int(msg_id[4:], 16)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xrange(history, "-", "+", count=1)
        pipe.xrevrange(history, "+", "-", count=1)
        first, last = (Span.of(e[0]) if e else None for e in guarded(pipe.execute))
        if not first or not last or last.last < wanted:
            return None
        clipped = first.first > wanted
        low, high = first.ms, last.ms
        while low < high:   # the first ms holding a message of count >= wanted
            middle = (low + high) // 2
            upto = guarded(lambda: self.redis.xrevrange(history, str(middle), "-", count=1))
            if upto and Span.of(upto[0]).last >= wanted:
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
        parts = self.store.parts(topic)
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
        joined = self.store.join_parts(topic, channel, "")
        if not joined[0].created:
            return None
        cuts = [j.cut for j in joined]
        parts = self.store.parts(topic)
        start = "-" if from_ms is None else f"{from_ms}-0"
        oldest = min((r.oldest_ms for r in self.retained(topic) if r.oldest_ms is not None),
                     default=0)
        size = sum(self.range_size(p, start, "+", cut) for p, cut in zip(parts, cuts) if cut)
        return ReplayPlan({"starts": [start] * len(parts), "end": "+", "cuts": cuts}, size,
                          oldest, from_ms is not None and from_ms < oldest)
