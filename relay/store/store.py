"""The Store: every change to queue state, as one Lua script call each, and the reads
of that state, in parts by who uses them: the data path (data_path.py: brokers), control
(control.py: the HTTP API, relay-admin, jobs), topics' histories (history.py:
retention and replay), idempotent publish (dedup.py), ordered delivery (ordering.py) and reads (reads.py: stats, the scanner,
wake-ups), over what they share (base.py: the client, the ScriptRunner, caches).
"""

from relay.store.control import Control
from relay.store.dedup import Dedup
from relay.store.history import History
from relay.store.ordering import Ordering


class Store(Ordering, Dedup, History, Control):
    """Typed access to relay's state in one Redis database; `redis` is its client."""
