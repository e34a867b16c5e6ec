"""The micro-batches of one Spark query on one channel, as kept in Redis (the source,
relay/spark/source.py, reads through them).

A batch's messages are claimed through deliver.lua, in flight under the batch's owner
`spark:<consumer>:<n>`, and its records are kept until the batch is confirmed: Spark
asked for the offsets after it, so its checkpoint holds the batch as done and no run of
the query reads it again. Then its claims are finished and its records dropped. Until
then any run of the query that reads the batch gets the same messages.

While the query runs, its source renews the claims of the batches it has not confirmed
(renew); when the query ends it parks them for park_timeout (park), so that a batch that
completed is handed to no one before the next run confirms it, and one that did not is
still there to be read again. A claim that ran out all the same (the driver's machine
died and the next run came after lease_timeout) went back to the queue: when its batch
is confirmed its id becomes a stray, and the query finishes and skips the copy when it
claims it again.

No pyspark here, and the Store keeps no Spark code: plain keys of the channel's slot.
"""

from typing import Sequence

from relay.codec import record_id
from relay.store import codes
from relay.store.keys import ChannelKeys

LEASE_MS = 60_000
PARK_MS = 7 * 24 * 3600 * 1000


class QueryBatches:
    """Claims, kept records and progress of Spark query `consumer` on topic/channel."""

    def __init__(self, store, topic: str, channel: str, consumer: str,
                 lease_ms: int = LEASE_MS, park_ms: int = PARK_MS):
        self.store, self.topic, self.channel, self.consumer = store, topic, channel, consumer
        self.lease_ms, self.park_ms = lease_ms, park_ms
        keys = ChannelKeys.of(topic, channel)
        self.progress_key = keys.spark(consumer, "progress")
        self.strays_key = keys.spark(consumer, "strays")
        self.batch_prefix = keys.spark(consumer, "batch:")

    def owner(self, batch: int) -> str:
        return f"spark:{self.consumer}:{batch}"

    def progress(self) -> dict:
        """The last batch claimed, confirmed (finished) and parked; 0: none."""
        raw = self.store.redis.hgetall(self.progress_key)
        return {k: int(raw.get(k.encode(), 0)) for k in ("claimed", "finished", "parked")}

    def records(self, batch: int) -> list:
        return self.store.redis.lrange(self.batch_prefix + str(batch), 0, -1)

    def claim(self, limit: int) -> int:
        """Claim up to `limit` queued messages as the next batch and keep their records;
        how many (0: none queued). Copies of messages the query already processed are
        finished and skipped."""
        batch = self.progress()["claimed"] + 1
        owner = self.owner(batch)
        while True:
            [records] = self.store.deliver(self.topic, self.channel,
                                           [(owner, self.lease_ms, limit)])
            if not records:
                return 0
            records = self._without_strays(owner, records)
            if records:
                break
        pipe = self.store.redis.pipeline(transaction=True)
        pipe.rpush(self.batch_prefix + str(batch), *records)
        pipe.hset(self.progress_key, "claimed", batch)
        pipe.execute()
        return len(records)

    def _without_strays(self, owner: str, records: Sequence[bytes]) -> list:
        ids = [record_id(r) for r in records]
        known = self.store.redis.smismember(self.strays_key, ids)
        strays = [i for i, k in zip(ids, known) if k]
        if strays:
            self.store.finish(self.topic, self.channel, [(owner, i) for i in strays])
            self.store.redis.srem(self.strays_key, *strays)
        return [r for r, k in zip(records, known) if not k]

    def confirm(self, through: int) -> dict:
        """Spark's checkpoint holds the batches up to `through` as done: finish their
        claims and drop their records; ids no longer in flight for them become strays.
        The progress after that."""
        progress = self.progress()
        for batch in range(progress["finished"] + 1, min(through, progress["claimed"]) + 1):
            ids = [record_id(r) for r in self.records(batch)]
            done = self.store.finish(self.topic, self.channel,
                                     [(self.owner(batch), i) for i in ids]) if ids else []
            lost = [i for i, d in zip(ids, done) if d != codes.DONE]
            pipe = self.store.redis.pipeline(transaction=True)
            if lost:
                pipe.sadd(self.strays_key, *lost)
                pipe.pexpire(self.strays_key, self.park_ms)
            pipe.delete(self.batch_prefix + str(batch))
            pipe.hset(self.progress_key, "finished", batch)
            pipe.execute()
            progress["finished"] = batch
        return progress

    def renew(self) -> int:
        """Push the claims of the running (not parked) unconfirmed batches lease_ms ahead;
        how many were no longer in flight for them."""
        p = self.progress()
        return self._hold(max(p["finished"], p["parked"]) + 1, p["claimed"], self.lease_ms)

    def park(self) -> None:
        """The query ended: hold the claims of every unconfirmed batch for park_ms, until
        a run of the query confirms or reads the batch again."""
        p = self.progress()
        self._hold(p["finished"] + 1, p["claimed"], self.park_ms)
        self.store.redis.hset(self.progress_key, "parked", p["claimed"])

    def _hold(self, first: int, last: int, ms: int) -> int:
        lost = 0
        for batch in range(first, last + 1):
            triples = [(self.owner(batch), record_id(r), ms) for r in self.records(batch)]
            if triples:
                deadlines = self.store.touch(self.topic, self.channel, triples)
                lost += sum(1 for d in deadlines
                            if d in (codes.NOT_IN_FLIGHT, codes.NOT_OWNER))
        return lost
