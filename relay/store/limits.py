"""A channel's limits (relay-admin limit, /channel/limit): its depth and its delivery rate.

Bounded channels (lib/limit.lua does the work in publish.lua): a channel's depth limit
and what a publish past it does, kept in the channel's meta hash on every part, with the
topic meta's count of limited channels (`limited_channels`), so that publishing to a
topic without one reads nothing more. On a topic of P partitions the limit holds per
part: each part's queue keeps at most ceil(N / P) (`part_max_depth`), as one script call
sees one part only; publishes go to the parts in turn, so they fill evenly, and the
channel holds at most P * ceil(N / P).

A delivery rate limit (rate.lua sets it, tokens.lua keeps its bucket): at most `per_s`
messages a second leave the channel for all its consumers on every broker, with bursts
of at most `burst` after a pause. Its bucket is one, on part 0, for all the parts: a
broker takes from it before each deliver call (relay/broker/channel.py), and every
part's meta holds the rate so that a deliver call that took nothing gets nothing."""

import math
import re
from typing import NamedTuple

from relay.errors import RelayError
from relay.store import codes
from relay.store.data_path import DataPath, Service
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.reads import Reads
from relay.store.runner import Op, guarded

OVERFLOWS = ("reject", "drop-oldest", "dead-letter")
LIMIT_FIELDS = (b"max_depth", b"part_max_depth", b"overflow")
RATE_BUCKET = b"rate_tat"       # the bucket's state (tokens.lua): part 0's alone


class OrderedAndLimited(RelayError):
    """A channel cannot be ordered (relay/store/ordering.py) and have a depth limit: the
    limit counts the queue, which on an ordered channel holds one message per key."""


class Limit(NamedTuple):
    """A channel's depth limit as set, and what a publish past it does."""
    max_depth: int
    overflow: str


class Rate(NamedTuple):
    """A channel's delivery rate limit: messages a second, and the most that go at once
    after a pause."""
    per_s: float
    burst: int


RATE_UNITS = {"s": 1, "m": 60, "h": 3600}
RATE_FORM = re.compile(r"(\d+(?:\.\d+)?)(?:/(s|m|h))?")
# the most messages a second a limit may allow (a limit is for slow consumers; past
# this one round of the delivery loop is longer than a token's interval)
MAX_RATE = 1_000_000


class BadRate(RelayError):
    """A rate that does not parse, or is out of range."""


class OldBrokers(RelayError):
    """A rate limit set while brokers of a release before rate limits run, whose deliver
    calls would not keep it."""


RATES_SINCE = "0.4.0"   # the first release whose brokers keep a channel's rate limit


def _release(text: str) -> tuple[int, ...]:
    """A release as a tuple to compare ("0.1.0 or earlier" as 0.1.0)."""
    return tuple(int(n) for n in text.split()[0].split("."))


def parse_rate(text: str, burst: int | None = None) -> Rate | None:
    """A rate as `N/s`, `N/m`, `N/h` or `N` (a second), or `off` (None), with its burst
    (by default a tenth of a second's messages, at least 1)."""
    if text == "off":
        return None
    form = RATE_FORM.fullmatch(text.strip())
    if not form:
        raise BadRate(f"rate {text!r}: not N/s, N/m, N/h or off")
    per_s = float(form.group(1)) / RATE_UNITS[form.group(2) or "s"]
    if not 0 < per_s <= MAX_RATE:
        raise BadRate(f"rate {text!r}: not above 0 and at most {MAX_RATE:,}/s")
    if burst is not None and burst < 1:
        raise BadRate(f"burst {burst}: below 1")
    return Rate(per_s, burst or max(1, math.ceil(per_s / 10)))


def part_share(max_depth: int, parts: int) -> int:
    """What each of `parts` parts may hold of a channel limited to `max_depth`."""
    return -(-max_depth // parts)


def _limit_op(part: str, channel: str, args: list) -> Op:
    """limit.lua on one part: codes.DONE, codes.NO_CHANNEL if the part has no such
    channel, or codes.ORDERED if the channel is ordered."""
    t = TopicKeys.of(part)
    return Op("limit", [t.channels, t.meta, ChannelKeys.of(part, channel).meta],
              [channel, *args])


def _rate_op(part: str, node: str, channel: str, rate: Rate | None) -> Op:
    """rate.lua on one part: codes.DONE, or codes.NO_CHANNEL if it has no such channel."""
    t = TopicKeys.of(part)
    return Op("rate", [t.channels, ChannelKeys.of(part, channel).meta, t.version],
              [channel, "" if rate is None else repr(rate.per_s), 0 if rate is None
               else rate.burst, t.wake, node])


class Limits(Service):
    """Setting and reading channels' depth and rate limits."""

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

    def set_rate(self, topic: str, channel: str, rate: Rate | None) -> bool:
        """Set (None: remove) the channel's delivery rate limit on every part, waking
        the brokers' delivery loops; False if it has no such channel. Raises OldBrokers
        when setting one while a broker of a release before RATES_SINCE runs."""
        if rate is not None:
            from relay.store.layout import Deployment      # layout imports the Store
            old = [p for p in Deployment.read(self.redis).processes
                   if p.kind == "broker" and _release(p.release) < _release(RATES_SINCE)]
            if old:
                raise OldBrokers(
                    f"a rate limit needs every broker at relay {RATES_SINCE} or later, "
                    "as older ones deliver past it: " + ", ".join(
                        f"{p.id} runs {p.release}" for p in old))
        parts = self.store.parts(topic, fresh=True)
        replies = self.store.run_many([_rate_op(part, self.store.node(part), channel, rate)
                                       for part in parts])
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return codes.NO_CHANNEL not in replies

    def rate(self, topic: str, channel: str) -> Rate | None:
        """The channel's rate limit in force (part 0's), or None."""
        per_s, burst = guarded(self.redis.hmget, ChannelKeys.of(topic, channel).meta,
                               "rate_per_s", "rate_burst")
        return None if per_s is None else Rate(float(per_s), int(burst))

    def limit(self, topic: str, channel: str) -> Limit | None:
        """The channel's limit in force (part 0's), or None."""
        depth, overflow = guarded(self.redis.hmget, ChannelKeys.of(topic, channel).meta,
                                      "max_depth", "overflow")
        return None if depth is None else Limit(int(depth), overflow.decode())

    def limit_report(self, topic: str, channel: str) -> dict:
        """The limit in force (None's without one), each part's share of it, and the
        channel's depth and what overflowed, summed over its parts: what relay-admin
        limit and /channel/limit show, with the rate limit (None's without one)."""
        now, rate = self.limit(topic, channel), self.rate(topic, channel)
        state = self.reads.read_channel(topic, channel)
        parts = len(self.store.parts(topic))
        return {"topic": topic, "channel": channel, "max_depth": now and now.max_depth,
                "overflow": now and now.overflow, "partitions": parts,
                "part_max_depth": now and part_share(now.max_depth, parts),
                "depth": state["depth"], "overflow_count": state["overflow_count"],
                "rate_per_s": rate and rate.per_s, "rate_burst": rate and rate.burst}
