"""A topic's retained history read by Spark without any channel: the batch read of a
time range (HistoryRead), one Spark partition per part of the topic, each in publish
order. (A streaming query that starts from a time: relay/spark/source.py.)"""

from pyspark.sql.datasource import DataSourceReader, InputPartition

from relay.spark.options import moment, required, store_of
from relay.spark.source import row
from relay.store.history import iso_ms, no_history


def time_range(options) -> tuple[int | None, int | None]:
    """startingTimestamp (inclusive) and endingTimestamp (exclusive) in ms; None where
    absent. An end not after the start is refused."""
    start, end = moment(options, "startingTimestamp"), moment(options, "endingTimestamp")
    if start is not None and end is not None and end <= start:
        raise ValueError(f"relay data source option endingTimestamp ({iso_ms(end)}) must be "
                         f"after startingTimestamp ({iso_ms(start)})")
    return start, end


class HistoryPart(InputPartition):
    """One part's range: up to `to_ms` inclusive, fixed when the read is planned (None:
    the part retained nothing then, and is not read)."""

    def __init__(self, part: str, to_ms: int | None):
        super().__init__(part)
        self.part, self.to_ms = part, to_ms


class HistoryRead(DataSourceReader):
    """The messages a topic retains in a time range, read through relay/store/history.py
    without touching any channel. Rows as the channel reads', channel null, attempts 0."""

    def __init__(self, options):
        self.options = dict(options)
        [self.topic] = required(options, "topic")
        if options.get("channel"):
            raise ValueError("relay data source: a read of a topic's history "
                             "(startingTimestamp, endingTimestamp) takes no channel option")
        self.from_ms, self.to_ms = time_range(options)

    def partitions(self):
        """A partition per part, each ending at endingTimestamp or, without one, at what
        the part retains now, so a task Spark runs again reads the same range."""
        store = store_of(self.options)
        if store.history.retention(self.topic) == (0, 0):
            raise no_history(self.topic)
        ends = [self.to_ms - 1 if self.to_ms is not None else kept.newest_ms
                for kept in store.history.retained(self.topic)]
        return [HistoryPart(part, end) for part, end in zip(store.parts(self.topic), ends)]

    def read(self, partition):
        if partition.to_ms is None:
            return
        store = store_of(self.options)
        for records in store.history.history_records(partition.part, self.from_ms, partition.to_ms):
            for record in records:
                yield row(self.topic, None, record)

