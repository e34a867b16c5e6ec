"""This broker's side of one channel: its local consumers; and each topic's delivery loop.

The loop (nsqd's messagePump, turned around): when some local client has RDY credit
and its channel may have messages, pop up to the summed credit in one deliver call and
hand each client its share. When a call comes back short or says the queue is empty,
the channel is drained and waits for a wake-up (a publish or requeue on this topic, via
Redis pub/sub, or the broker's once-a-second read of its topics' versions when one was
missed: relay/broker/wakeups.py) or more credit.

One loop serves all of a topic's channels on this broker (Deliveries): each round
takes every channel told to look again since the round before, and the channels of one
topic part that have work go in one deliver_many call (at most MANY_CHANNELS each), so
a publish to a topic of 5,000 channels costs 50 calls and no greenlet per channel. A
round with one channel in a part makes a plain deliver call, into which the group
commit folds the FINs that came before it.

A channel deleted or emptied elsewhere is seen the same two ways, and compared with
what SUB returned (its incarnation and count of empties, subscribe.lua).

A channel with a delivery rate limit (relay/store/limits.py) takes from its bucket before
each deliver call (tokens.lua: one call for all such channels of a round, side by side),
delivers at most what it took, and gives back what the call did not use. When it took
fewer than its credit, it waits the time the bucket names (at most RATE_RECHECK, so a
rate raised while it waits counts within that) before it asks again. A broker learns a
channel has a limit from a deliver call that therefore brought nothing, and that it has
none from the bucket's answer.

A partitioned topic's channel has a part in each of the topic's parts (keys.py). The
loop then spreads each round's credit over the parts that may have messages, starting
one further each round, so none starves: a part with messages is asked within as many
rounds as there are parts. A part whose call comes back drained waits for its own
wake-up.
"""


import logging

import gevent
from gevent.event import AsyncResult, Event

from relay.broker.client import Client
from relay.broker.context import BrokerContext
from relay.errors import StoreError
from relay.sockio import Turns
from relay.store.commit import Submitted
from relay.store.keys import id_part
from relay.store.replies import Delivered, Subscribed
from relay.store.runner import MAX_CALL_ARGS, Op

log = logging.getLogger("relay.channel")

RETRY_DELAY = 0.5
# the longest a rate-limited channel waits for its bucket before it asks again
RATE_RECHECK = 1.0
# consumers in one deliver call (4 arguments each): a bounded call however many there are
MAX_GROUPS = MAX_CALL_ARGS // 4 - 4
# channels in one deliver_many call: each costs Redis 30-60 us here, so a call stays
# within a few ms (no call over 10 ms: issue 57), and its consumers' groups within
# MAX_GROUPS
MANY_CHANNELS = 50


class Part:
    """The channel in one part of its topic: the lane its calls take, whether it may have
    messages, and what SUB there returned."""

    __slots__ = ("index", "name", "order", "maybe_ready", "arrivals", "incarnation",
                 "empties", "held", "ordered")

    def __init__(self, name: str, channel: str, index: int, joined: Subscribed):
        """`name`: the part's (Store.parts)."""
        self.index = index
        self.name = name
        self.order = hash((self.name, channel))
        self.maybe_ready = True
        self.arrivals = 0
        self.incarnation = joined.incarnation
        self.empties = joined.empties
        # finish calls held for its next deliver call, and their results (settling.py)
        self.held: list[tuple[Op, AsyncResult]] = []
        self.ordered = False    # as its last deliver call said: a FIN may release a message


class Channel:
    def __init__(self, deliveries: "Deliveries", name: str, parts: list[str],
                 joined: list[Subscribed]):
        """`joined`: what SUB returned in each of the `parts`; `deliveries`: its topic's
        loop."""
        self.deliveries = deliveries
        self.broker = deliveries.broker
        self.topic = deliveries.topic
        self.name = name
        self.clients: list[Client] = []
        self.parts = [Part(p, name, i, j) for i, (p, j) in enumerate(zip(parts, joined))]
        self.stopped = False
        self._turn = 0
        self.limited = False        # has a rate limit: takes from it before delivering
        self.granted: int | None = None     # taken for this round's calls (limited)
        self._held = False          # waits for its bucket (hold)

    def __repr__(self) -> str:
        return f"Channel({self.topic}/{self.name})"

    @property
    def incarnations(self) -> list[int]:
        return [p.incarnation for p in self.parts]

    def part_of(self, msg_id: bytes) -> Part:
        """The part a message id names (part 0 for one no part has: its FIN fails)."""
        index = id_part(msg_id)
        return self.parts[index] if 0 <= index < len(self.parts) else self.parts[0]

    def rejoined(self, parts: list[str], joined: list[Subscribed]) -> None:
        """The channel was deleted and created again: the parts SUB joined now."""
        self.parts = [Part(p, self.name, i, j) for i, (p, j) in enumerate(zip(parts, joined))]

    def grow(self, parts: list[str], joined: list[Subscribed]) -> None:
        """The topic has more parts now: the local consumers joined the channel in the new
        `parts`, `joined` what SUB returned there."""
        for part, joined_part in zip(parts, joined):
            self.parts.append(Part(part, self.name, len(self.parts), joined_part))
        self.messages_arrived()

    def credit_changed(self) -> None:
        """A client's credit may have changed (RDY, FIN, REQ, a timeout, its unsent
        messages written) or a client came or went: look again, unless no part may
        have messages (a wake-up makes it look then: messages_arrived)."""
        if any(p.maybe_ready for p in self.parts):
            self.deliveries.look(self)

    def messages_arrived(self, index: int | None = None) -> None:
        """Messages may have arrived in Redis, in part `index` or any: a wake-up came, or
        one may have been missed."""
        for part in self.parts if index is None else self.parts[index:index + 1]:
            part.arrivals += 1
            part.maybe_ready = True
        self.deliveries.look(self)

    def check(self, index: int, incarnation: int | None, empties: int) -> None:
        """Compare the channel's part in Redis (Store.channel_states, Subscribed) with the
        one the local consumers joined: deleted (or deleted and created again) or emptied."""
        if index >= len(self.parts):
            return
        if incarnation != self.parts[index].incarnation:
            self.deleted()
        else:
            self.emptied(empties, index)

    def deleted(self) -> None:
        """The channel (or its topic) was deleted: close its consumers, as nsqd."""
        if self.clients:
            log.info("%s/%s deleted: closing its %d consumers",
                     self.topic, self.name, len(self.clients))
        for client in list(self.clients):
            client.close()

    def emptied(self, empties: int, index: int = 0) -> None:
        """The channel's part was emptied (the `empties`th time): what its consumers held
        in flight there is gone, so their RDY credit is free again at once, as nsqd."""
        if index >= len(self.parts) or empties <= self.parts[index].empties:
            return
        self.parts[index].empties = empties
        for client in self.clients:
            client.forget(None if len(self.parts) == 1 else
                          [i for i in client.in_flight if id_part(i) == index])
        self.messages_arrived(index)

    def add(self, client: Client) -> None:
        self.clients.append(client)
        client.channel = self
        self.credit_changed()

    def remove(self, client: Client) -> None:
        if client in self.clients:
            self.clients.remove(client)
        self.credit_changed()

    def stop(self) -> None:
        """No more rounds. What a deliver call in the air brings for clients that left
        is given back (Client.accept): stopping it there would lose that reply's records
        until their msg_timeout."""
        self.stopped = True

    def wanted(self) -> int:
        """The messages this channel's next round would ask for: its clients' credit, or
        0 when it has none, no part may have messages or its rate limit holds it."""
        if self.stopped or self._held or not any(p.maybe_ready for p in self.parts):
            return 0
        return sum(max(0, c.credit()) for c in self.clients)

    def hold(self, wait_ms: int) -> None:
        """The bucket has nothing for `wait_ms` ms: look again then (at most
        RATE_RECHECK)."""
        self._held = True
        gevent.spawn_later(min(wait_ms / 1000, RATE_RECHECK), self._unhold)

    def _unhold(self) -> None:
        self._held = False
        self.deliveries.look(self)

    def round(self) -> list:
        """This round's work (_shares): none when no client has credit or no part may
        have messages; with a rate limit, at most what was taken from it (`granted`).
        The clients take turns at being first: a call pops for its groups in order, and
        when it finds fewer messages than they ask (an ordered channel's released keys)
        the first one of a fixed order took them all, and the others' credit stayed
        unused (a consumer got 0 of 1,650 beside one that got all)."""
        if self.stopped:
            return []
        groups = [(c, c.credit()) for c in self.clients]
        groups = [(c, n) for c, n in groups if n > 0]
        if not groups or not any(p.maybe_ready for p in self.parts):
            return []
        first = self._turn % len(groups)
        groups = groups[first:] + groups[:first]
        if self.granted is not None:
            groups = self._capped(groups, self.granted)
        return self._shares(groups)

    def _capped(self, groups: list[tuple[Client, int]], cap: int) -> list:
        """The groups' credit cut to `cap` in all, shared evenly (the first ones get the
        odd ones)."""
        capped = []
        for k, (client, credit) in enumerate(groups):
            share = min(credit, -(-cap // (len(groups) - k)))
            if share > 0:
                capped.append((client, share))
            cap -= share
        return capped

    def _shares(self, groups: list[tuple[Client, int]]) -> list:
        """(part, [(client, count, bytes)]) for this round: each client's credit and room
        for unsent bytes split over the ready parts, from the part one further than the
        round before; a part's consumers in calls of at most MAX_GROUPS."""
        first = self._turn % len(self.parts)
        self._turn += 1
        ready = [p for p in self.parts[first:] + self.parts[:first] if p.maybe_ready]
        shares: dict[int, list] = {}
        for client, credit in groups:
            spread = min(credit, len(ready))
            room = client.unsent_room()
            for k in range(spread):
                count = credit // spread + (k < credit % spread)
                shares.setdefault(k, []).append((client, count, max(1, room // spread)))
        return [(ready[k], share[i:i + MAX_GROUPS]) for k, share in sorted(shares.items())
                for i in range(0, len(share), MAX_GROUPS)]

    def hand_out(self, part: Part, share: list, seen: int, batches: Delivered) -> int:
        """Give each client its records; returns how many were delivered."""
        settling = self.broker.settling
        self.limited = batches.limited
        delivered = sum(len(records) for records in batches)
        if batches.empties < part.empties:
            return delivered  # popped before an empty already applied: they went with it
        self.emptied(batches.empties, part.index)
        part.ordered = batches.ordered
        self.broker.metrics.delivered += delivered
        for group, ((client, _, _), records) in enumerate(zip(share, batches)):
            give_back, sampled_out = client.accept(records, batches.lot(group))
            if client.in_flight:
                self.broker.holding.add(client)
            if give_back:
                settling.requeue(self, client.owner, [(i, 0) for i in give_back])
            if sampled_out:
                settling.finish(self, client.owner, sampled_out)
        if not batches.more and part.arrivals == seen and not (part.ordered and part.held):
            part.maybe_ready = False    # drained (a call cut short by bytes is not, nor an
            # ordered part with FINs held, each of which may release a message)
        return delivered


class Deliveries:
    """One topic's delivery loop on this broker: rounds over the channels told to look
    again (Channel.look), one deliver call per part for all of those with work there."""

    def __init__(self, broker: BrokerContext, topic: str):
        self.broker = broker
        self.topic = topic
        self.stopped = False
        self.busy = False       # waiting for its calls: FINs are held (settling.py)
        self._looking: dict[Channel, None] = {}     # in the order told
        self._told = Event()
        self._turns = Turns()   # handing out to thousands of channels holds no one up
        self._greenlet = gevent.spawn(self._loop)

    def channel(self, name: str, parts: list[str], joined: list[Subscribed]) -> Channel:
        return Channel(self, name, parts, joined)

    def look(self, channel: Channel) -> None:
        self._looking[channel] = None
        self._told.set()

    def stop(self) -> None:
        """End the loop once its round in the air, if any, is handed out."""
        self.stopped = True
        self._told.set()

    def flush(self, channel: Channel, part: Part | None = None) -> None:
        """Send the finish calls held for the channel (or one part of it) on their
        lanes, each result given to its FINs' (settling.py)."""
        commit = self.broker.commit
        for p in channel.parts if part is None else (part,):
            held, p.held = p.held, []
            for op, result in held:
                commit.submit(op, p.order).rawlink(result)

    def _loop(self) -> None:
        try:
            while not self.stopped:
                self._told.wait()
                self._told.clear()
                looking, self._looking = self._looking, {}
                self._take_tokens(looking)
                work = [(channel, share) for channel in looking
                        for share in channel.round()]
                dealt = {(channel, part) for channel, (part, _) in work}
                delivering = {channel for channel, _ in work}
                for channel in looking:     # held for a deliver call not made this round
                    for part in channel.parts:
                        if part.held and (channel, part) not in dealt:
                            self.flush(channel, part)
                    if channel.granted and channel not in delivering:
                        self._give_back(channel, 0)     # its credit went while it took
                if work:
                    self._deliver(work)
        finally:
            for channel in self._looking:
                self.flush(channel)

    def _take_tokens(self, looking: dict) -> None:
        """Each rate-limited channel's take from its bucket for this round, in calls
        side by side (granted: None for a channel without a limit, 0 for one that got
        nothing and waits)."""
        store, commit = self.broker.store, self.broker.commit
        calls = []
        for channel in looking:
            channel.granted = None
            if channel.limited:
                channel.granted = 0
                if wanted := channel.wanted():
                    calls.append((channel, wanted, commit.submit(
                        store.tokens_op(self.topic, channel.name, wanted),
                        channel.parts[0].order)))
        for channel, wanted, call in calls:
            try:
                tokens = call.get()
            except StoreError as e:
                log.warning("rate limit of %s/%s not read: %s", self.topic, channel.name, e)
                gevent.spawn_later(RETRY_DELAY, self.look, channel)
                continue
            if tokens.rate is None:
                channel.limited, channel.granted = False, None
                continue
            channel.granted = tokens.taken
            if tokens.taken < wanted:
                channel.hold(tokens.wait_ms)

    def _give_back(self, channel: Channel, delivered: int) -> None:
        """What a limited channel took and its calls did not deliver, back to its bucket."""
        unused = (channel.granted or 0) - delivered
        channel.granted = None
        if unused > 0:
            self.broker.commit.submit(self.broker.store.tokens_op(
                self.topic, channel.name, -unused), channel.parts[0].order)

    def _deliver(self, work: list[tuple[Channel, tuple]]) -> None:
        """Submit every call of the round, then hand out each reply. A channel whose
        call failed looks again after RETRY_DELAY; one not drained, at once (more credit
        makes it look by itself: Channel.credit_changed)."""
        self.busy = True
        try:
            self._deliver_round(work)
        finally:
            self.busy = False

    def _deliver_round(self, work: list[tuple[Channel, tuple]]) -> None:
        by_part: dict[str, list] = {}
        for channel, (part, share) in work:
            by_part.setdefault(part.name, []).append((channel, part, share))
        calls = [(chunk, [p.arrivals for _, p, _ in chunk], self._submit(name, chunk))
                 for name, entries in by_part.items() for chunk in _chunks(entries)]
        failed: dict[Channel, None] = {}
        delivered: dict[Channel, int] = {}
        for chunk, seen, call in calls:
            try:
                replies = call.get()
            except StoreError as e:
                log.warning("deliver %s failed (%d channels): %s", chunk[0][1].name,
                            len(chunk), e)
                failed.update((channel, None) for channel, _, _ in chunk)
                continue
            for (channel, part, share), arrivals, batches in zip(chunk, seen, replies):
                delivered[channel] = delivered.get(channel, 0) + \
                    channel.hand_out(part, share, arrivals, batches)
                self._turns.take()
        for channel in dict.fromkeys(channel for channel, _ in work):
            if channel.granted is not None:
                self._give_back(channel, delivered.get(channel, 0))
            if channel in failed:
                gevent.spawn_later(RETRY_DELAY, self.look, channel)
            elif any(p.maybe_ready for p in channel.parts):
                self.look(channel)

    def _submit(self, part: str, chunk: list) -> Submitted:
        """A deliver call for one channel (its FINs may fold into it), else deliver_many:
        a Submitted whose value is a list of one Delivered per channel."""
        store, commit, attempts = self.broker.store, self.broker.commit, \
            self.broker.options.max_attempts
        for channel, p, _ in chunk:     # right before: the commit folds them into it
            if p.held:
                self.flush(channel, p)
        if len(chunk) == 1:
            channel, p, share = chunk[0]
            return _Listed(commit.submit(store.deliver_op(
                part, channel.name, [(c.owner, c.msg_timeout, n, room) for c, n, room in share],
                attempts, channel.granted is not None, self.broker.lots), p.order))
        return commit.submit(store.deliver_many_op(
            part, [(channel.name, [(c.owner, c.msg_timeout, n, room) for c, n, room in share],
                    channel.granted is not None)
                   for channel, _, share in chunk], attempts, self.broker.lots), hash(part))


def _chunks(entries: list) -> list[list]:
    """The (channel, part, share) entries of one part in calls of at most MANY_CHANNELS
    channels and MAX_GROUPS consumers."""
    chunks: list[list] = [[]]
    groups = 0
    for entry in entries:
        if chunks[-1] and (len(chunks[-1]) == MANY_CHANNELS
                           or groups + len(entry[2]) > MAX_GROUPS):
            chunks.append([])
            groups = 0
        chunks[-1].append(entry)
        groups += len(entry[2])
    return chunks


class _Listed:
    """One deliver call's result as a list of one (as deliver_many's)."""

    __slots__ = ("call",)

    def __init__(self, call: Submitted):
        self.call = call

    def get(self) -> list:
        return [self.call.get()]
