"""The source: a streaming read of a channel in micro-batches that Spark's checkpoint
confirms (ChannelStream, with relay/spark/batches.py), which may start from a time of
the topic's history (start_channel), and a batch read of a channel's ready queue
(ChannelSnapshot). The batch read of the history is relay/spark/history.py."""

import datetime
import logging
import signal
import sys
import threading

from pyspark.sql.datasource import (DataSourceReader, DataSourceStreamReader, InputPartition)
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from relay.codec import parse_record
from relay.spark.batches import LEASE_MS, PARK_MS, QueryBatches
from relay.spark.options import moment, required, store_of
from relay.store.history import iso_ms, no_history
from workers import operations

log = logging.getLogger("relay.spark")

SNAPSHOT_CHUNK = 1000
SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def row(topic: str, channel: str | None, record: bytes) -> tuple:
    """A stored record as a row of the source's schema."""
    ts, attempts, msg_id, body = parse_record(record)
    when = datetime.datetime.fromtimestamp(ts / 1e9, datetime.timezone.utc)
    return (msg_id.decode(), topic, channel, body, when.replace(tzinfo=None), attempts)


def start_channel(options, topic: str, channel: str) -> None:
    """A new streaming query with startingTimestamp: create its channel with what the
    topic retains from then on queued in publish order (Store.create_from_start: the cut
    is taken as the channel is made, so the history and what is published after meet
    with nothing missed or twice), before its first batch is claimed. A channel that
    exists is left as it is and read from where it stands."""
    from_ms = moment(options, "startingTimestamp")
    if from_ms is None:
        return
    store = store_of(options)
    if store.history.retention(topic) == (0, 0):
        raise no_history(topic)
    plan = store.history.create_from_start(topic, channel, from_ms)
    if plan is None:
        log.warning("channel %s/%s exists: startingTimestamp is ignored, the query reads "
                    "the channel from where it stands", topic, channel)
        return
    if plan.clipped:
        log.warning("topic %s retains messages from %s on: the channel starts there",
                    topic, iso_ms(plan.oldest_ms))
    operations.run(store, "replay", topic, channel, params=plan.params)


class BatchPartition(InputPartition):
    def __init__(self, batch: int):
        super().__init__(batch)
        self.batch = batch


class ChannelStream(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of claimed messages; offsets are {"batch": n}, the query's own batch
    numbers (relay/spark/batches.py). Spark calls every method but read() in one process
    of the driver that lives as long as the query: the first call starts the lease keeper
    there, and stop() parks what is not confirmed."""

    def __init__(self, options):
        self.options = dict(options)
        self.topic, self.channel = required(options, "topic", "channel")
        self.consumer = options.get("consumer", "spark")
        self.limit = int(options.get("max_messages_per_batch", 1000))
        self.lease_ms = int(options.get("lease_timeout", LEASE_MS))
        self.park_ms = int(options.get("park_timeout", PARK_MS))
        if moment(options, "endingTimestamp") is not None:
            raise ValueError("relay data source: endingTimestamp is a batch read's; a "
                             "streaming query takes only startingTimestamp")
        moment(options, "startingTimestamp")    # refused now if it is not a time
        self.available = None       # availableNow: how many messages this run may still claim
        self.available_now = False
        self._query = None
        self._keeper = None

    def _batches(self) -> QueryBatches:
        return QueryBatches(store_of(self.options), self.topic, self.channel, self.consumer,
                            self.lease_ms, self.park_ms)

    def _driver(self) -> QueryBatches:
        if self._query is None:
            self._query = self._batches()
            self._keeper = LeaseKeeper(self._batches())
            if _in_source_runner():
                signal.signal(signal.SIGTERM, _exit)
        return self._query

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.limit)

    def prepareForTriggerAvailableNow(self) -> None:
        """availableNow: this run takes what is queued when it plans its first batch (after
        initialOffset, which may make the channel), in batches of the read limit."""
        self.available_now = True

    def initialOffset(self) -> dict:
        """A new query (no checkpoint): with startingTimestamp its channel is made first."""
        start_channel(self.options, self.topic, self.channel)
        return {"batch": self._driver().progress()["finished"]}

    def latestOffset(self, start: dict, limit) -> dict:
        """Spark asks for what follows `start` only once its checkpoint holds every batch
        up to `start` as done: confirm them. Then the batch a run claimed but did not get
        to plan, else a newly claimed one, else `start` again (nothing new); with
        ReadAllAvailable (Trigger.Once), everything queued."""
        query = self._driver()
        if self.available_now and self.available is None:
            self.available = query.store.reads.read_channel(self.topic, self.channel)["depth"]
        progress = query.confirm(start["batch"])
        claimed = progress["claimed"]
        if claimed > start["batch"]:
            return {"batch": claimed}
        if isinstance(limit, ReadAllAvailable):
            while query.claim(self.limit):
                claimed += 1
        elif self.available is None:
            claimed += bool(query.claim(limit.max_rows))
        elif self.available > 0:
            count = query.claim(min(limit.max_rows, self.available))
            self.available = self.available - count if count else 0
            claimed += bool(count)
        return {"batch": claimed}

    def partitions(self, start: dict, end: dict):
        self._driver()
        return [BatchPartition(b) for b in range(start["batch"] + 1, end["batch"] + 1)]

    def read(self, partition):
        for record in self._batches().records(partition.batch):
            yield row(self.topic, self.channel, record)

    def commit(self, end: dict) -> None:
        self._driver().confirm(end["batch"])

    def stop(self) -> None:
        """The query ended, cleanly or not (Spark ends this process with SIGTERM, or it
        sees the driver's JVM go): park every batch not confirmed yet."""
        if self._keeper is not None:
            if _in_source_runner():
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self._keeper.stop()
            self._keeper.batches.park()


class LeaseKeeper(threading.Thread):
    """Renews the claims of the query's unconfirmed batches every third of lease_timeout
    while the query lives, so a batch slower than the lease keeps its messages."""

    def __init__(self, batches: QueryBatches):
        super().__init__(name=f"relay-lease-{batches.consumer}", daemon=True)
        self.batches = batches
        self.done = threading.Event()
        self.lost = 0
        self.start()

    def run(self) -> None:
        while not self.done.wait(self.batches.lease_ms / 3000):
            try:
                lost = self.batches.renew()
            except Exception:
                log.exception("renewing the claims of Spark query %s failed; trying again",
                              self.batches.consumer)
                continue
            if lost > self.lost:
                log.warning("%d claims of Spark query %s ran out before their batch was "
                            "confirmed: copies it claims again are skipped", lost,
                            self.batches.consumer)
            self.lost = lost

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=10)


_exiting = threading.Event()


def _in_source_runner() -> bool:
    """Whether this is Spark's process for the source's driver calls, on its main thread."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return (spec is not None and spec.name == SOURCE_RUNNER
            and threading.current_thread() is threading.main_thread())


def _exit(signum, frame):
    """Spark ends the source's process with SIGTERM without calling stop(): exit through
    the runner's `finally`, which calls it. Spark sends SIGTERM twice (stopWorker, then
    the factory's stop); only the first may raise, or the second would cut stop() short
    before it parks."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not _exiting.is_set():
        _exiting.set()
        raise SystemExit(0)


class ChannelSnapshot(DataSourceReader):
    """The channel's ready queue as it is; nothing is claimed or removed."""

    def __init__(self, options):
        self.options = dict(options)
        self.topic, self.channel = required(options, "topic", "channel")

    def read(self, partition):
        store = store_of(self.options)
        for records in store.reads.queued_records(self.topic, self.channel, SNAPSHOT_CHUNK):
            for record in records:
                yield row(self.topic, self.channel, record)
