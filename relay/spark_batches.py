"""The micro-batches of one Spark query on one channel, as kept in Redis (relay/spark.py).

No pyspark here: the state is plain Redis keys of the channel's slot
(ChannelKeys.spark), so the Store itself keeps no Spark code.
"""

from typing import Sequence

from relay.store.keys import ChannelKeys


class QueryBatches:
    """Progress and claimed records of Spark query `consumer` on topic/channel."""

    def __init__(self, store, topic: str, channel: str, consumer: str):
        self.store, self.topic, self.channel = store, topic, channel
        keys = ChannelKeys.of(topic, channel)
        self.progress_key = keys.spark(consumer, "progress")
        self.batch_prefix = keys.spark(consumer, "batch:")

    def progress(self) -> dict:
        """The last micro-batch claimed, finished and committed (0: none)."""
        raw = self.store.redis.hgetall(self.progress_key)
        return {k: int(raw.get(k.encode(), 0)) for k in ("claimed", "finished", "committed")}

    def save(self, batch: int, records: Sequence[bytes]) -> None:
        """Keep what a batch claimed, so Spark reading it again gets the same records."""
        pipe = self.store.redis.pipeline(transaction=True)
        pipe.rpush(self.batch_prefix + str(batch), *records)
        pipe.hset(self.progress_key, "claimed", batch)
        pipe.execute()

    def records(self, batch: int) -> list:
        return self.store.redis.lrange(self.batch_prefix + str(batch), 0, -1)

    def finished(self, batch: int) -> None:
        self.store.redis.hset(self.progress_key, "finished", batch)

    def close(self, batch: int) -> None:
        pipe = self.store.redis.pipeline(transaction=True)
        pipe.delete(self.batch_prefix + str(batch))
        pipe.hset(self.progress_key, "committed", batch)
        pipe.execute()
