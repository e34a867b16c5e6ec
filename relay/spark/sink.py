"""The sink: a DataFrame's `body` column published to a topic through publish.lua, as
MPUB, in chunks (batch and streaming writes), each row with a publish key
(relay/store/dedup.py), so that within the topic's dedup window a retried task or a
micro-batch run again publishes nothing twice.

A row's key is its `idColumn`'s value when that option names a column; else where the
row stands: "<query id>:<batch id>:<partition>:<row>" in a streaming write (the query
id and batch id are kept in the checkpoint, so a batch run again after a restart has
the same keys), "<write id>:<partition>:<row>" in a batch write (the write id is made
once per write, on the driver, so a retried task has the same keys). Keys by position
hold while a task run again sees the same rows in the same order, as it does reading
relay's source; name a column when it may not.
"""

import uuid

from pyspark import TaskContext
from pyspark.sql.datasource import (DataSourceStreamWriter, DataSourceWriter,
                                    WriterCommitMessage)

from relay.spark.options import required, store_of
from relay.store.dedup import key_problem

PUBLISH_CHUNK = 500
# the local properties Spark gives a streaming query's tasks (StreamExecution's)
QUERY_ID, BATCH_ID = "sql.streaming.queryId", "streaming.sql.batchId"


class Published(WriterCommitMessage):
    def __init__(self, count: int, duplicates: int = 0):
        self.count = count
        self.duplicates = duplicates


class TopicWriter(DataSourceWriter):
    """Publishes each row's body to the topic in chunks, as MPUB does, with its key."""

    def __init__(self, options):
        self.options = dict(options)
        [self.topic] = required(options, "topic")
        self.id_column = self.options.get("idcolumn") or self.options.get("idColumn")
        self.write_id = uuid.uuid4().hex
        if self.id_column and not store_of(self.options).dedup.dedup_window(self.topic):
            raise ValueError(
                f"relay sink: topic {self.topic} has no dedup window, so idColumn "
                f"{self.id_column!r} would not keep duplicates out: turn it on with "
                f"relay-admin dedup {self.topic} --window 10m")

    def key_prefix(self, context: TaskContext | None) -> str:
        """What the positional keys of this task start with (outside a Spark task, a
        writer called directly, as partition 0)."""
        return f"{self.write_id}:{context.partitionId() if context else 0}"

    def row_key(self, row, prefix: str, position: int) -> bytes:
        if not self.id_column:
            return f"{prefix}:{position}".encode()
        value = row[self.id_column]
        key = value.encode() if isinstance(value, str) else str(value).encode()
        problem = None if value is not None else "ID_EMPTY"
        problem = problem or key_problem(key)
        if problem:
            raise ValueError(f"relay sink: idColumn {self.id_column!r} of row {position} is "
                             f"{value!r}: {problem} (1-256 bytes of text without spaces)")
        return key

    def write(self, iterator) -> Published:
        store = store_of(self.options)
        prefix = self.key_prefix(TaskContext.get())
        chunk: list[bytes] = []
        keys: list[bytes] = []
        count = duplicates = 0
        for position, row in enumerate(iterator):
            body = row["body"]
            chunk.append(body.encode() if isinstance(body, str) else bytes(body))
            keys.append(self.row_key(row, prefix, position))
            if len(chunk) == PUBLISH_CHUNK:
                duplicates += store.dedup.publish_keyed(self.topic, chunk, keys)
                count, chunk, keys = count + len(chunk), [], []
        if chunk:
            duplicates += store.dedup.publish_keyed(self.topic, chunk, keys)
            count += len(chunk)
        return Published(count - duplicates, duplicates)


class TopicStreamWriter(TopicWriter, DataSourceStreamWriter):
    """Each micro-batch is published as it is written; its keys name the query and the
    batch, so a batch Spark runs again (a retried task, a restart from the checkpoint)
    publishes nothing twice within the topic's dedup window."""

    def key_prefix(self, context: TaskContext | None) -> str:
        if context is None:
            return super().key_prefix(context)
        query, batch = context.getLocalProperty(QUERY_ID), context.getLocalProperty(BATCH_ID)
        return f"{query}:{batch}:{context.partitionId()}"

    # a stream writer's (DataSourceStreamWriter), not TopicWriter's DataSourceWriter's
    def commit(self, messages, batchId) -> None:  # type: ignore[override]
        pass

    def abort(self, messages, batchId) -> None:  # type: ignore[override]
        pass
