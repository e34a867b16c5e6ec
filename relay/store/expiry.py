"""Message expiry (relay-admin ttl): a topic's TTL and its channels' (ttl.lua), which
deliver.lua checks as it pops each record, and the scanner's sweep (expire.lua), which
takes the expired messages nobody consumes out of the head of their queues, so that
`depth` and Redis' memory do not keep what no one will be given.

A part's topic meta says whether any of its channels has a TTL: `ttl_ms` (the topic's,
copied into its channels) or `channel_ttl` (set by ttl.lua while a channel has its
own), so the sweep calls expire.lua only on parts where it can find something."""

from typing import Any, NamedTuple, Sequence

from relay.store import codes
from relay.store.data_path import DataPath, Service
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.reads import Reads
from relay.store.runner import Op, guarded

CHANNEL_TTL_FIELD = "channel_ttl"
EXPIRE_MOST = 1000      # messages one expire.lua call takes out at most (about 1 ms)


class Expired(NamedTuple):
    """How many messages one expire.lua call took out (expired, or spent: delivered
    max-attempts times already), and whether it stopped at its bound."""
    taken_out: int
    more: bool

    @classmethod
    def parse(cls, reply: Any) -> "Expired":
        return cls(int(reply[0]), bool(int(reply[1])))


class Expiry(Service):
    """Message TTLs, and the sweep of expired messages."""

    def __init__(self, store: DataPath, reads: Reads) -> None:
        super().__init__(store)
        self.reads = reads

    def ttl_op(self, part: str, channel: str | None, ttl_ms: int | None) -> Op:
        """ttl.lua on one part: codes.DONE, or codes.NO_CHANNEL if the channel is not
        one of its."""
        t = TopicKeys.of(part)
        return self.store.fanout_op("ttl", part, [t.meta, t.channels],
                               [channel or "", "" if ttl_ms is None else ttl_ms])

    def set_ttl(self, topic: str, channel: str | None, ttl_ms: int | None) -> bool:
        """Set (None: clear) the message TTL of a topic, for its channels without one of
        their own and those made later, or of one channel, on every part (ttl.lua).
        False if the channel is not one of the topic's."""
        return codes.NO_CHANNEL not in [self.store.run(self.ttl_op(part, channel, ttl_ms))
                                        for part in self.store.parts(topic)]

    def ttl_settings(self, topic: str) -> dict:
        """The TTLs as part 0 has them: {"ttl_ms": the topic's or None, "channels":
        {name: {"ttl_ms": in force or None, "source": "channel", "topic" or None}}}."""
        names = self.reads.channel_names(topic)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(TopicKeys.of(topic).meta, "ttl_ms")
        for channel in names:
            pipe.hmget(ChannelKeys.of(topic, channel).meta, "ttl_ms", "ttl_from")
        own, *channels = guarded(pipe.execute)
        return {"ttl_ms": _ms(own), "channels": {
            name: {"ttl_ms": _ms(ttl), "source": source.decode() if source else None}
            for name, (ttl, source) in zip(names, channels)}}

    def expire_op(self, part: str, max_attempts: int = 0, most: int = EXPIRE_MOST) -> Op:
        """One step of the sweep of a part's expired messages (expire.lua): an Expired.
        `max_attempts`: the brokers' --max-attempts, which decides, where a channel has
        no setting of its own, whether its expired messages are dead letters."""
        t = TopicKeys.of(part)
        return self.store.fanout_op("expire", part, [t.meta, t.channels, t.due, t.version],
                               [most, max_attempts, self.store.node(part), t.wake], Expired.parse)

    def expire_parts(self, parts: Sequence[str], seconds: float | None = None,
                     max_attempts: int = 0) -> int:
        """expire_op on each of `parts` where a channel has a TTL, again on those it
        left more to do until none does or, given `seconds` (the scanner's sweep),
        until they have passed: the messages taken out (in_rounds)."""
        pipe = self.redis.pipeline(transaction=False)
        for part in parts:
            pipe.hmget(TopicKeys.of(part).meta, "ttl_ms", CHANNEL_TTL_FIELD)
        with_ttl = [part for part, (ttl, own) in zip(parts, guarded(pipe.execute))
                    if int(ttl or 0) > 0 or own]
        return self.store.in_rounds(with_ttl, lambda part: self.expire_op(part, max_attempts),
                              seconds)


def _ms(value: bytes | None) -> int | None:
    return None if value is None else int(value)
