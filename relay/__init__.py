"""relay: an NSQ-compatible message broker whose queues live in Redis."""

import os

# rq's keys share one hash tag, so its transactions stay in one Redis Cluster slot.
# rq reads this when it is imported: relay's modules import it after this line.
os.environ.setdefault("RQ_KEY_PREFIX", "{rq}")

__version__ = "0.6.2"
