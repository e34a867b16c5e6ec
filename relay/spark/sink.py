"""The sink: a DataFrame's `body` column published to a topic through publish.lua, as
MPUB, in chunks (batch and streaming writes)."""

from pyspark.sql.datasource import (DataSourceStreamWriter, DataSourceWriter,
                                    WriterCommitMessage)

from relay.spark.options import required, store_of

PUBLISH_CHUNK = 500


class Published(WriterCommitMessage):
    def __init__(self, count: int):
        self.count = count


class TopicWriter(DataSourceWriter):
    """Publishes each row's body to the topic in chunks, as MPUB does."""

    def __init__(self, options):
        self.options = dict(options)
        [self.topic] = required(options, "topic")

    def write(self, iterator) -> Published:
        store, chunk, count = store_of(self.options), [], 0
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

    # a stream writer's (DataSourceStreamWriter), not TopicWriter's DataSourceWriter's
    def commit(self, messages, batchId) -> None:  # type: ignore[override]
        pass

    def abort(self, messages, batchId) -> None:  # type: ignore[override]
        pass
