"""relay topics and channels as a PySpark data source (pyspark 4's Python Data Source API).

    import relay.spark
    relay.spark.register(spark)
    spark.readStream.format("relay").option("redis_url", url)
         .option("topic", "events").option("channel", "spark").load()

Streaming read: each micro-batch claims up to max_messages_per_batch messages of the
channel through deliver.lua, in flight under the batch's owner ("spark:<consumer>:<n>")
for lease_timeout ms, so NSQ consumers of the same channel never get them meanwhile.
The claimed records are kept in Redis per batch, so a batch Spark reads again after a
failure has the same messages. They are finished (finish.lua) once Spark is done with
the batch: when it plans the next one (which it does only after the previous batch
completed) or commits it, whichever comes first. A query that dies for good leaves its
claims to expire: the scanner requeues them after lease_timeout. Delivery is at least
once: a batch still running when its lease runs out is delivered again.

Batch read: a snapshot of the channel's ready queue (not its in-flight or deferred
messages), read without taking anything. Write (batch and streaming): the `body` column
(binary or string) is published through publish.lua, like MPUB, in chunks.
"""

import datetime

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    DataSourceStreamWriter, DataSourceWriter, InputPartition,
                                    WriterCommitMessage)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

SCHEMA = ("id string, topic string, channel string, body binary, timestamp timestamp, "
          "attempts int")
PUBLISH_CHUNK = 500
SNAPSHOT_CHUNK = 1000


def register(spark) -> None:
    """Make format("relay") available on this session."""
    spark.dataSource.register(RelayDataSource)


def _store(options):
    from relay.store import Store
    from relay.store.connection import connect
    return Store(connect(options.get("redis_url", "redis://127.0.0.1:6379/0")))


def _row(topic: str, channel: str, record: bytes) -> tuple:
    from relay.codec import parse_record
    ts, attempts, msg_id, body = parse_record(record)
    moment = datetime.datetime.fromtimestamp(ts / 1e9, datetime.timezone.utc)
    return (msg_id.decode(), topic, channel, body, moment.replace(tzinfo=None), attempts)


def _required(options, *names) -> list:
    missing = [n for n in names if not options.get(n)]
    if missing:
        raise ValueError(f"relay data source needs option {missing[0]!r}")
    return [options[n] for n in names]


class RelayDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "relay"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema):
        return ChannelSnapshot(self.options)

    def streamReader(self, schema):
        return ChannelStream(self.options)

    def writer(self, schema, overwrite):
        return TopicWriter(self.options)

    def streamWriter(self, schema, overwrite):
        return TopicStreamWriter(self.options)


class BatchPartition(InputPartition):
    def __init__(self, batch: int):
        super().__init__(batch)
        self.batch = batch


class ChannelStream(DataSourceStreamReader):
    """Micro-batches of claimed messages; offsets are {"batch": n}."""

    def __init__(self, options):
        self.options = dict(options)
        self.topic, self.channel = _required(options, "topic", "channel")
        self.consumer = options.get("consumer", "spark")
        self.limit = int(options.get("max_messages_per_batch", 1000))
        self.lease_ms = int(options.get("lease_timeout", 60_000))

    def getDefaultReadLimit(self):
        """One claimed batch per micro-batch; a trigger that asks for everything
        (availableNow) gets ReadAllAvailable instead."""
        return ReadMaxRows(self.limit)

    def initialOffset(self) -> dict:
        return {"batch": self._progress()["committed"]}

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        """Batches up to `start` were processed (Spark plans one batch at a time): FIN
        them. Then the batch claimed but not planned yet (after a restart), else a newly
        claimed one, else `start` again (nothing new); with ReadAllAvailable
        (availableNow), everything queued now as well."""
        store = _store(self.options)
        progress = self._progress()
        planned = start["batch"] if start else progress["committed"]
        self._finish_through(store, planned, progress)
        claimed = progress["claimed"]
        everything = isinstance(limit, ReadAllAvailable)
        if claimed > planned and not everything:
            return {"batch": claimed}
        while self._claim(store, claimed + 1):
            claimed += 1
            if not everything:
                break       # ReadMaxRows: one batch of max_messages_per_batch
        return {"batch": claimed}

    def _claim(self, store, batch: int) -> bool:
        [records] = store.deliver(self.topic, self.channel,
                                  [(self._owner(batch), self.lease_ms, self.limit)])
        if records:
            self._batches(store).save(batch, records)
        return bool(records)

    def partitions(self, start: dict, end: dict):
        return [BatchPartition(b) for b in range(start["batch"] + 1, end["batch"] + 1)]

    def read(self, partition):
        store = _store(self.options)
        for record in self._batches(store).records(partition.batch):
            yield _row(self.topic, self.channel, record)

    def commit(self, end: dict) -> None:
        """FIN what is not finished yet, and forget the batches up to `end`."""
        store = _store(self.options)
        progress = self._progress()
        self._finish_through(store, end["batch"], progress)
        for batch in range(progress["committed"] + 1, end["batch"] + 1):
            self._batches(store).close(batch)

    def _finish_through(self, store, last: int, progress: dict) -> None:
        """FIN the claims of the batches after the last finished one, up to `last`. The
        records stay for a re-run of the batch until Spark commits it."""
        from relay.codec import record_id
        for batch in range(progress["finished"] + 1, last + 1):
            records = self._batches(store).records(batch)
            if records:
                store.finish(self.topic, self.channel,
                             [(self._owner(batch), record_id(r)) for r in records])
            self._batches(store).finished(batch)
            progress["finished"] = batch

    def _progress(self) -> dict:
        return self._batches(_store(self.options)).progress()

    def _batches(self, store):
        from relay.spark_batches import QueryBatches
        return QueryBatches(store, self.topic, self.channel, self.consumer)

    def _owner(self, batch: int) -> str:
        return f"spark:{self.consumer}:{batch}"


class ChannelSnapshot(DataSourceReader):
    """The channel's ready queue as it is; nothing is claimed or removed."""

    def __init__(self, options):
        self.options = dict(options)
        self.topic, self.channel = _required(options, "topic", "channel")

    def read(self, partition):
        store = _store(self.options)
        for records in store.queued_records(self.topic, self.channel, SNAPSHOT_CHUNK):
            for record in records:
                yield _row(self.topic, self.channel, record)


class Published(WriterCommitMessage):
    def __init__(self, count: int):
        self.count = count


class TopicWriter(DataSourceWriter):
    """Publishes each row's body to the topic in chunks, as MPUB does."""

    def __init__(self, options):
        self.options = dict(options)
        [self.topic] = _required(options, "topic")

    def write(self, iterator) -> Published:
        store, chunk, count = _store(self.options), [], 0
        for row in iterator:
            body = row["body"]
            chunk.append(body.encode() if isinstance(body, str) else bytes(body))
            if len(chunk) == PUBLISH_CHUNK:
                store.publish(self.topic, chunk)
                count, chunk = count + len(chunk), []
        if chunk:
            store.publish(self.topic, chunk)
            count += len(chunk)
        return Published(count)


class TopicStreamWriter(TopicWriter, DataSourceStreamWriter):
    """Each micro-batch is published as it is written: a retried task publishes its rows
    again (at least once), as a producer that retries a PUB does."""

    def commit(self, messages, batchId) -> None:
        pass

    def abort(self, messages, batchId) -> None:
        pass
