"""FIN, REQ and TOUCH, in one place: a connection's commands (protocol/v2.py), what a
delivery gives back or samples out (Channel.hand_out) and what a leaving consumer held
(Broker._disconnect). Each goes by the part of the topic its message id names, one call
per part, on that part's lane: there the deliver call for the credit it frees is likely
to join it.

FINs that come while their channel's delivery loop waits for its call are held for the
loop's next deliver call of their part (Deliveries.flush), into which the group commit
folds them: consumers at RDY 1 FIN while the loop waits, and each FIN was a call of its
own. So are all FINs of an ordered channel's part, which may each release a message of
its key: the part may have messages again, and the call that finishes one message
delivers the next (lib/order.lua). A REQ or TOUCH of the channel sends what is held
first, so none overtakes a FIN."""

from typing import TYPE_CHECKING, Any, Callable, Sequence

from gevent.event import AsyncResult

if TYPE_CHECKING:
    from typing import TypeAlias

    from relay.broker.channel import Channel, Part
    from relay.broker.context import BrokerContext
    from relay.store.commit import Submitted
    from relay.store.runner import Op

    # each part's call, and the positions of its items among those given
    Calls: TypeAlias = list[tuple[Submitted, Sequence[int]]]


class Settling:
    def __init__(self, broker: "BrokerContext") -> None:
        self.broker = broker

    def finish(self, channel: "Channel", owner: str, ids: Sequence[bytes],
               order: int | None = None) -> "Calls":
        items = [(owner, msg_id) for msg_id in ids]
        if order is None and (channel.deliveries.busy or any(p.ordered for p in channel.parts)):
            return self._held(channel, items)
        return self._by_part(channel, self.broker.store.finish_op, items, order)

    def requeue(self, channel: "Channel", owner: str, delays: Sequence[tuple[bytes, int]],
                order: int | None = None) -> "Calls":
        """REQ of each (id or lot item, delay ms)."""
        channel.deliveries.flush(channel)
        return self._by_part(channel, self.broker.store.requeue_op,
                             [(owner, msg_id, delay) for msg_id, delay in delays], order)

    def touch(self, channel: "Channel", owner: str, msg_id: bytes, timeout: int) -> "Calls":
        channel.deliveries.flush(channel)
        return self._by_part(channel, self.broker.store.touch_op, [(owner, msg_id, timeout)])

    def _by_part(self, channel: "Channel", make_op: "Callable[..., Op]", items: list[tuple],
                 order: int | None = None) -> "Calls":
        """make_op's call for the items (id second) of each part, on that part's lane
        unless `order` names another."""
        commit = self.broker.commit
        return [(commit.submit(make_op(part.name, channel.name, [items[i] for i in where]),
                               part.order if order is None else order), where)
                for part, where in _positions(channel, items)]

    def _held(self, channel: "Channel", items: list[tuple]) -> "Calls":
        """The finish call of each part, held for the loop's next deliver call there; its
        result is set from the call's once the loop sends it."""
        store = self.broker.store
        calls: "Calls" = []
        for part, where in _positions(channel, items):
            result: AsyncResult = AsyncResult()
            part.held.append((store.finish_op(part.name, channel.name,
                                              [items[i] for i in where]), result))
            if part.ordered:
                part.maybe_ready = True
            calls.append((result, where))
        channel.deliveries.look(channel)
        return calls


def _positions(channel: "Channel", items: list[tuple]) -> "list[tuple[Part, Sequence[int]]]":
    """Each part the items' ids (second) name, and the items' positions."""
    if not items:
        return []
    if len(channel.parts) == 1:
        return [(channel.parts[0], range(len(items)))]
    positions: dict["Part", list[int]] = {}
    for i, item in enumerate(items):
        positions.setdefault(channel.part_of(item[1]), []).append(i)
    return list(positions.items())


def wait_all(calls: "Calls") -> list[Any]:
    """Each call's value, in order; the first error raises."""
    return [result.get() for result, _ in calls]
