"""This broker's side of one channel: its local consumers and one delivery loop.

The loop (nsqd's messagePump, turned around): when some local client has RDY
credit and the channel may have messages, pop up to the summed credit in one
deliver call and hand each client its share. When a call comes back short, the
channel is drained and the loop sleeps until a wake-up (a publish or requeue
on this topic, via Redis pub/sub), more credit, or the slow safety poll.
"""

import logging

import gevent
from gevent.event import Event

from relay.client import Client
from relay.context import BrokerContext
from relay.errors import StoreError

log = logging.getLogger("relay.channel")

SAFETY_POLL = 1.0
RETRY_DELAY = 0.5


class Channel:
    def __init__(self, broker: BrokerContext, topic: str, name: str):
        self.broker = broker
        self.topic = topic
        self.name = name
        self.clients: list[Client] = []
        self.maybe_ready = True
        self.arrivals = 0
        self.order = hash((topic, name))
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
                if not self._look_again.wait(SAFETY_POLL):
                    self.maybe_ready = True
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
        wanted = got = 0
        self.broker.metrics.delivered.inc(sum(len(records) for records in batches))
        for (client, n), records in zip(groups, batches):
            wanted += n
            got += len(records)
            give_back, sampled_out = client.accept(records)
            if give_back:
                commit.submit(store.requeue_op(self.topic, self.name,
                                               [(client.owner, i, 0) for i in give_back]),
                              client.number)
            if sampled_out:
                commit.submit(store.finish_op(self.topic, self.name,
                                              [(client.owner, i) for i in sampled_out]),
                              client.number)
        if got < wanted and self.arrivals == seen:
            self.maybe_ready = False
