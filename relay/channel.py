"""This broker's side of one channel: its local consumers and one delivery loop.

The loop (nsqd's messagePump, turned around): when some local client has RDY
credit and the channel may have messages, pop up to the summed credit in one
deliver call and hand each client its share. When a call comes back short, the
channel is drained and the loop sleeps until a wake-up (a publish or requeue
on this topic, via Redis pub/sub, or the broker's once-a-second read of its topics'
versions when one was missed: relay/wakeups.py) or more credit.

A channel deleted or emptied elsewhere is seen the same two ways, and compared with
what SUB returned (its incarnation and count of empties, subscribe.lua).
"""


import logging

import gevent
from gevent.event import Event

from relay.client import Client
from relay.context import BrokerContext
from relay.errors import StoreError
from relay.store.store import Subscribed

log = logging.getLogger("relay.channel")

RETRY_DELAY = 0.5


class Channel:
    def __init__(self, broker: BrokerContext, topic: str, name: str, joined: Subscribed):
        self.broker = broker
        self.topic = topic
        self.name = name
        self.clients: list[Client] = []
        self.maybe_ready = True
        self.arrivals = 0
        self.order = hash((topic, name))
        self.incarnation = joined.incarnation
        self.empties = joined.empties
        self.stopped = False
        self._look_again = Event()
        self._greenlet = gevent.spawn(self._loop)

    def __repr__(self):
        return f"Channel({self.topic}/{self.name})"

    def credit_changed(self) -> None:
        """A client's credit may have changed (RDY, FIN, REQ, a timeout, its unsent
        messages written) or a client came or went: look again."""
        self._look_again.set()

    def messages_arrived(self) -> None:
        """Messages may have arrived in Redis: a wake-up came, or one may have been missed."""
        self.arrivals += 1
        self.maybe_ready = True
        self._look_again.set()

    def check(self, incarnation: int | None, empties: int) -> None:
        """Compare the channel in Redis (Store.channel_states, Subscribed) with the one
        the local consumers joined: deleted (or deleted and created again) or emptied."""
        if incarnation != self.incarnation:
            self.deleted()
        else:
            self.emptied(empties)

    def deleted(self) -> None:
        """The channel (or its topic) was deleted: close its consumers, as nsqd."""
        if self.clients:
            log.info("%s/%s deleted: closing its %d consumers",
                     self.topic, self.name, len(self.clients))
        for client in list(self.clients):
            client.close()

    def emptied(self, empties: int) -> None:
        """The channel was emptied (the `empties`th time): what its consumers held in
        flight is gone, so their RDY credit is free again at once, as nsqd."""
        if empties <= self.empties:
            return
        self.empties = empties
        for client in self.clients:
            client.in_flight.clear()
        self.messages_arrived()

    def add(self, client: Client) -> None:
        self.clients.append(client)
        client.channel = self
        self.credit_changed()

    def remove(self, client: Client) -> None:
        if client in self.clients:
            self.clients.remove(client)
        self.credit_changed()

    def stop(self) -> None:
        """End the loop once its deliver call in the air, if any, is back: killing it
        there would lose that reply's records until their msg_timeout. What it brings
        for clients that left is given back (Client.accept)."""
        self.stopped = True
        self._look_again.set()

    def _loop(self) -> None:
        while not self.stopped:
            self._look_again.clear()
            groups = [(c, c.credit()) for c in self.clients]
            groups = [(c, n) for c, n in groups if n > 0]
            if not groups or not self.maybe_ready:
                self._look_again.wait()
                continue
            self._deliver(groups)

    def _deliver(self, groups: list[tuple[Client, int]]) -> None:
        store, commit = self.broker.store, self.broker.commit
        seen = self.arrivals
        op = store.deliver_op(self.topic, self.name,
                              [(c.owner, c.msg_timeout, n) for c, n in groups],
                              self.broker.options.max_attempts)
        try:
            batches = commit.call(op, self.order)
        except StoreError as e:
            log.warning("deliver %s/%s failed: %s", self.topic, self.name, e)
            gevent.sleep(RETRY_DELAY)
            return
        if batches.empties < self.empties:
            return  # popped before an empty already applied: they went with it
        self.emptied(batches.empties)
        wanted = got = 0
        self.broker.metrics.delivered.inc(sum(len(records) for records in batches))
        for (client, n), records in zip(groups, batches):
            wanted += n
            got += len(records)
            give_back, sampled_out = client.accept(records)
            if client.in_flight:
                self.broker.holding.add(client)
            if give_back:
                commit.submit(store.requeue_op(self.topic, self.name,
                                               [(client.owner, i, 0) for i in give_back]),
                              self.order)
            if sampled_out:
                commit.submit(store.finish_op(self.topic, self.name,
                                              [(client.owner, i) for i in sampled_out]),
                              self.order)
        if got < wanted and self.arrivals == seen:
            self.maybe_ready = False
