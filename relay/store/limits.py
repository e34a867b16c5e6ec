"""Bounded channels (relay-admin limit; lib/limit.lua does the work in publish.lua): a
channel's depth limit and what a publish past it does, kept in the channel's meta hash
on every part, with the topic meta's count of limited channels (`limited_channels`),
so that publishing to a topic without one reads nothing more.

On a topic of P partitions the limit holds per part: each part's queue keeps at most
ceil(N / P) (`part_max_depth`), as one script call sees one part only; publishes go to
the parts in turn, so they fill evenly, and the channel holds at most P * ceil(N / P)."""

from typing import NamedTuple

from relay.errors import RelayError
from relay.store import codes
from relay.store.data_path import DataPath, Service
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.reads import Reads
from relay.store.runner import Op, guarded

OVERFLOWS = ("reject", "drop-oldest", "dead-letter")
LIMIT_FIELDS = (b"max_depth", b"part_max_depth", b"overflow")


class OrderedAndLimited(RelayError):
    """A channel cannot be ordered (relay/store/ordering.py) and have a depth limit: the
    limit counts the queue, which on an ordered channel holds one message per key."""


class Limit(NamedTuple):
    """A channel's depth limit as set, and what a publish past it does."""
    max_depth: int
    overflow: str


def part_share(max_depth: int, parts: int) -> int:
    """What each of `parts` parts may hold of a channel limited to `max_depth`."""
    return -(-max_depth // parts)


def _limit_op(part: str, channel: str, args: list) -> Op:
    """limit.lua on one part: codes.DONE, codes.NO_CHANNEL if the part has no such
    channel, or codes.ORDERED if the channel is ordered."""
    t = TopicKeys.of(part)
    return Op("limit", [t.channels, t.meta, ChannelKeys.of(part, channel).meta],
              [channel, *args])


class Limits(Service):
    """Setting and reading channels' depth limits."""

    def __init__(self, store: DataPath, reads: Reads) -> None:
        super().__init__(store)
        self.reads = reads

    def set_limit(self, topic: str, channel: str, limit: Limit | None) -> bool:
        """Set (None: remove) the channel's limit on every part; False if it has no
        such channel."""
        parts = self.store.parts(topic, fresh=True)
        args = ["", 0, ""] if limit is None else \
            [limit.max_depth, part_share(limit.max_depth, len(parts)), limit.overflow]
        replies = self.store.run_many([_limit_op(part, channel, args) for part in parts])
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
            if reply == codes.ORDERED:
                raise OrderedAndLimited(f"channel {topic}/{channel} is ordered: turn that off "
                                   "first (relay-admin order --off), a depth limit and "
                                   "ordered delivery do not go together")
        return codes.NO_CHANNEL not in replies

    def limit(self, topic: str, channel: str) -> Limit | None:
        """The channel's limit in force (part 0's), or None."""
        depth, overflow = guarded(self.redis.hmget, ChannelKeys.of(topic, channel).meta,
                                      "max_depth", "overflow")
        return None if depth is None else Limit(int(depth), overflow.decode())

    def limit_report(self, topic: str, channel: str) -> dict:
        """The limit in force (None's without one), each part's share of it, and the
        channel's depth and what overflowed, summed over its parts: what relay-admin
        limit and /channel/limit show."""
        now = self.limit(topic, channel)
        state = self.reads.read_channel(topic, channel)
        parts = len(self.store.parts(topic))
        return {"topic": topic, "channel": channel, "max_depth": now and now.max_depth,
                "overflow": now and now.overflow, "partitions": parts,
                "part_max_depth": now and part_share(now.max_depth, parts),
                "depth": state["depth"], "overflow_count": state["overflow_count"]}
