"""What the scripts reply, parsed: the types the Store's calls return (each parse is an
Op's), and the sum of a topic's or channel's parts."""

from typing import Any, NamedTuple

from relay import codec
from relay.errors import StoreError


class Dropped(NamedTuple):
    """What drop.lua took out: the topic's last message id at that moment (the cut:
    everything published later stays) and the trash keys that now hold it."""

    last_id: int
    trash: list

    @classmethod
    def parse(cls, reply: list[Any] | None) -> "Dropped | None":
        return None if reply is None else cls(reply[0], [k.decode() for k in reply[1:]])


class Published:
    """publish.lua's reply to the publishes merged into one call: the count of the last
    message when each was published whole, else per publish (the count of its last
    message or 0, its duplicates), or the StoreError of its refusal (a full channel's:
    the others of the call went ahead)."""

    @staticmethod
    def parse(reply: Any) -> "int | list":
        if not isinstance(reply, list):
            return int(reply)
        return [StoreError(codec.as_text(reply[i + 1])) if isinstance(reply[i + 1], bytes)
                else (int(reply[i]), int(reply[i + 1])) for i in range(0, len(reply), 2)]

    @staticmethod
    def duplicates(reply: list) -> int:
        """A keyed publish's own reply: its duplicates."""
        return int(reply[1])

    @staticmethod
    def split(published: "int | list", sizes: list[int], keyed: bool) -> list:
        """Each publish's result (its messages `sizes` in order), as its own call's parse
        gives it: with keys its duplicates, else the count of its last message."""
        if isinstance(published, int):
            if keyed:
                return [0] * len(sizes)
            lasts, last = [], published - sum(sizes)
            for size in sizes:
                last += size
                lasts.append(last)
            return lasts
        return [answer if isinstance(answer, StoreError) else answer[1 if keyed else 0]
                for answer in published]


class Stepped(NamedTuple):
    """publish_step.lua's reply: the messages this step published and those left, and
    for a wide publish (lib/wide.lua) the channels of the slice that comes next."""

    published: int
    left: int
    channels: list[str] | None = None

    @property
    def more(self) -> bool:
        return self.left > 0

    @classmethod
    def parse(cls, reply: list[Any]) -> "Stepped":
        return cls(int(reply[0]), int(reply[1]), [c.decode() for c in reply[2:]] or None)


class Subscribed(NamedTuple):
    """subscribe.lua's reply: whether the channel is new, what a broker compares
    to see it deleted (a new incarnation each time it is created) or emptied, the
    cut a channel created from the beginning replays the history up to, how many
    channels the part has now, and whether the part's backlog is to go over in steps
    (`hand_over`: Store.hand_over runs them)."""

    created: bool
    incarnation: int
    empties: int
    cut: int = 0
    channels: int = 0
    hand_over: bool = False

    @classmethod
    def parse(cls, reply: list[Any]) -> "Subscribed":
        return cls(bool(reply[0]), int(reply[1]), int(reply[2]), int(reply[3]), int(reply[4]),
                   bool(reply[5]))


class Delivered(list):
    """deliver.lua's reply: one list of records per group (this delivery counted in
    their attempts: codec.delivered), the channel's count of
    empties when they were popped (`empties`), the codes of the FINs folded into
    the call (`finished`, as finish_op's), whether the queue has more (`more`),
    whether the channel is ordered (`ordered`) and whether it has a rate limit
    (`limited`: a call that took nothing from it first got nothing), and the name of the
    lot each group went in flight as (`lots`: lib/inflight.lua; b"" for a group of one
    by one; empty if no group went as a lot, `lotted` false)."""

    empties: int = 0
    finished: list = []
    more: bool = False
    ordered: bool = False
    limited: bool = False
    lots: list = []

    @classmethod
    def parse(cls, reply: list[Any]) -> "Delivered":
        delivered = cls([[codec.delivered(r) for r in group] for group in reply[:-6]])
        delivered.empties = int(reply[-6])
        delivered.finished = reply[-5]
        delivered.more = bool(reply[-4])
        delivered.ordered = bool(reply[-3])
        delivered.limited = bool(reply[-2])
        delivered.lots = reply[-1]
        return delivered

    @property
    def lotted(self) -> bool:
        return bool(self.lots)

    def lot(self, group: int) -> bytes:
        """The name of the lot group `group` went in flight as, b"" if none."""
        return self.lots[group] if self.lots else b""

    @classmethod
    def parse_many(cls, reply: list[Any]) -> "list[Delivered]":
        """deliver_many.lua's reply: one Delivered per channel."""
        return [cls.parse(channel) for channel in reply]


class Tokens(NamedTuple):
    """tokens.lua's reply: how many messages a broker took from a channel's rate limit,
    in how many ms it may take more when it took none, and the rate (msgs/s; None: the
    channel has no limit, and it took what it asked)."""

    taken: int
    wait_ms: int
    rate: float | None

    @classmethod
    def parse(cls, reply: list[Any]) -> "Tokens":
        return cls(int(reply[0]), int(reply[1]), float(reply[2]) if reply[2] else None)


class DueView(NamedTuple):
    now: int
    due: list
    more: bool
    failed: int


# read as part 0 has them, not summed
FIRST_PART_ONLY = ("paused", "client_count", "ordered", "rate_limit")


def summed(parts: list[dict]) -> dict:
    """One dict of the parts' counts: summed, but FIRST_PART_ONLY as part 0's (the one
    part's own dict when there is one)."""
    if len(parts) == 1:
        return parts[0]
    total = dict(parts[0])
    for part in parts[1:]:
        for name, value in part.items():
            if name not in FIRST_PART_ONLY:
                total[name] += value
    return total
