"""The reaper: removes what a dead broker left in Redis (run by each scanner).

A broker killed with -9 cannot unsubscribe its consumers or give back what its
connections held. When its registration expires (relay/broker/registry.py), the reaper
takes its id out of every channel's consumers, deletes the ephemeral channels (and
ephemeral topics) that leaves without a consumer, and requeues at once the messages
its connections held in flight (their leases name the owner "broker id:connection"),
rather than at their timeout: reap.lua, one call per channel, single-slot.

Each scanner looks for dead brokers among the consumers of its share of the topics
at its first check and when a broker leaves the live set; and in between it sweeps the
share a slice at each check, the whole share in SWEEP_EVERY seconds or, past SWEEP_MOST
parts a check, longer: a sweep reads every channel's consumers, so an idle scanner's
cost stays bounded whatever the number of topics. An id seen to leave
is reaped at once, one never seen live once it stays unregistered for GRACE seconds
(a starting broker may count a consumer just before its first heartbeat). The reap
of an id is done by the one scanner that claims it (SET NX) for all topics; the claim
expires if that scanner dies half way, and reap.lua is safe to run again, so another
then finishes the reap. A broker whose heartbeats stall past its registration's TTL
is taken for dead too: what it held in flight may then be delivered twice (at least
once, as after a timeout).
"""

import bisect
import logging
import math
import time
from functools import cached_property

from relay.broker.registry import broker_liveness
from relay.liveness import Liveness
from relay.store import Store, bookkeeping, codes, guarded, keys

log = logging.getLogger("relay.reaper")

CHECK_EVERY = 1.0
SWEEP_EVERY = 60.0
SWEEP_MOST = 10         # parts swept at most per check (each costs a command per channel
                        # and one more)
GRACE = 1.0
CLAIM_TTL_MS = 30_000
DONE_TTL_MS = 600_000


class Reaper:
    def __init__(self, store: Store, reaper_id: str, clock=time.monotonic):
        self.store = store
        self.id = reaper_id
        self.clock = clock
        self.live: set[str] = set()
        self.suspects: dict[str, float] = {}
        self._checked = float("-inf")
        self._swept: str | None = None   # the last part swept; None: none yet
        self.reaped = 0

    @cached_property
    def brokers(self) -> Liveness:
        """The live brokers, on the store's client (made at first use)."""
        return broker_liveness(self.store.redis)

    def check(self, topics: list[str]) -> None:
        """Every CHECK_EVERY: look for dead brokers among the consumers of `topics`
        when one left the live set or a sweep is due; reap those past their GRACE."""
        now = self.clock()
        if now - self._checked < CHECK_EVERY:
            return
        self._checked = now
        live = set(guarded(self.brokers.live))
        left, self.live = self.live - live, live
        swept = topics if left or self._swept is None else self._slice(topics)
        if swept:
            self._swept = swept[-1] if swept is not topics else ""
            for broker_id in self.store.reads.consumer_brokers(swept) - live:
                self.suspects.setdefault(broker_id, float("-inf") if broker_id in left else now)
        for broker_id, since in list(self.suspects.items()):
            if broker_id in live:
                del self.suspects[broker_id]
            elif now - since >= GRACE and self.reap(broker_id):
                del self.suspects[broker_id]

    def _slice(self, topics: list[str]) -> list[str]:
        """The next parts of the sweep (`topics` sorted), after the last one swept."""
        n = min(math.ceil(len(topics) * CHECK_EVERY / SWEEP_EVERY), SWEEP_MOST)
        start = bisect.bisect_right(topics, self._swept or "")
        return (topics[start:] + topics[:start])[:n]

    def reap(self, broker_id: str) -> bool:
        """Remove what `broker_id` left in every channel, if this reaper claims it.
        False while another holds the claim (try again: it may die half way)."""
        claim = keys.reap_claim_key(broker_id)
        redis = self.store.redis
        if not guarded(bookkeeping.write, redis,
                       ("SET", claim, self.id, "NX", "PX", CLAIM_TTL_MS))[0]:
            return guarded(redis.get, claim) == b"done"
        channels = requeued = 0
        for part in self.store.reads.stored_parts():
            guarded(redis.pexpire, claim, CLAIM_TTL_MS)
            names = self.store.reads.channel_names(part)
            results = self.store.run_many([self.store.reap_op(part, c, broker_id)
                                           for c in names])
            for result in results:
                if isinstance(result, Exception):
                    raise result
                gone, n = result
                channels += gone != codes.KEPT
                requeued += n
            if any(r[0] == codes.TOPIC_DELETED for r in results) \
                    and keys.PART_MARK not in part:
                self.store.control.forget_topic(part)
        guarded(bookkeeping.write, redis, ("SET", claim, "done", "PX", DONE_TTL_MS))
        self.reaped += 1
        log.info("reaped dead broker %s: %d ephemeral channels deleted, %d in-flight "
                 "messages requeued", broker_id, channels, requeued)
        return True
