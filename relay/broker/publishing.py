"""The one path of a publish, for TCP PUB, DPUB and MPUB (protocol/v2.py) and HTTP /pub and
/mpub (http/nsqd.py): the front ends parse and answer; this resolves the order keys
(given, or by the topic's rule: relay/store/ordering.py) and the priorities (given, or
by the topic's rule: relay/store/priorities.py), builds the ops (one, or with
keys one per part they reach), submits them on the group commit, and counts what a
reply says was published (publish keys: relay/store/dedup.py)."""

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relay.broker.context import BrokerContext
    from relay.store.commit import Submitted


class Publishing:
    def __init__(self, broker: "BrokerContext") -> None:
        self.broker = broker

    def submit(self, topic: str, bodies: list[bytes], defer: int = 0,
               publish_keys: list[bytes] | None = None,
               order_keys: "list[bytes | None] | None" = None,
               order: int | None = None, priority: int | None = None) -> "Submitted":
        """The publish, submitted in `order` (a connection's: its publishes stay in
        order), all at `priority` if given. Reading the topic's partitions or rule first
        may raise StoreError: then nothing was sent."""
        since = time.monotonic()    # building the op may read the topic's partitions first
        store, commit = self.broker.store, self.broker.commit
        keys = store.ordering.order_keys(topic, bodies, order_keys)
        ranks = store.priorities.of(topic, bodies, priority)
        if publish_keys is None and keys is None and ranks is None:
            return commit.submit(store.publish_op(topic, bodies, defer), order, since)
        return commit.submit_all(store.dedup.keyed_publish_ops(
            topic, bodies, publish_keys, defer, keys, ranks), order, since)

    def published(self, count: int, publish_keys: list[bytes] | None, value: Any) -> int:
        """How many of the `count` messages were duplicates (not published), from the
        submitted publish's value; the rest are counted as published."""
        duplicates = sum(value) if publish_keys is not None else 0
        self.broker.metrics.published += count - duplicates
        return duplicates
