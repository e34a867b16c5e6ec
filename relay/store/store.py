"""The Store: every change to queue state, as one Lua script call each, and the reads
of that state. The Store itself is the data path (data_path.py: brokers' publishes,
deliveries and settling, over base.py's client, ScriptRunner and caches); the rest are
services with one job each (data_path.Service), each given the data path and the
services it asks: `reads` (reads.py:
stats, the scanner, wake-ups), `control` (control.py: the HTTP API, relay-admin, jobs),
`expiry` (expiry.py: TTLs), `limits` (limits.py: depth limits), `history` (history.py:
retention and replay), `dedup` (dedup.py: idempotent publish), `ordering`
(ordering.py: ordered delivery) and `priorities` (priorities.py: message priorities).
"""

from typing import Any

from relay.store.control import Control
from relay.store.data_path import DataPath
from relay.store.dedup import Dedup
from relay.store.expiry import Expiry
from relay.store.history import History
from relay.store.limits import Limits
from relay.store.ordering import Ordering
from relay.store.priorities import Priorities
from relay.store.reads import Reads


class Store(DataPath):
    """Typed access to relay's state in one Redis database; `redis` is its client."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads = Reads(self)
        self.limits = Limits(self, self.reads)
        self.control = Control(self, self.reads, self.limits)
        self.expiry = Expiry(self, self.reads)
        self.history = History(self)
        self.dedup = Dedup(self)
        self.ordering = Ordering(self)
        self.priorities = Priorities(self)
