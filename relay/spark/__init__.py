"""relay topics and channels as a PySpark data source (pyspark 4's Python Data Source API).

    import relay.spark
    relay.spark.register(spark)
    spark.readStream.format("relay").option("redis_url", url)
         .option("topic", "events").option("channel", "spark").load()

Streaming read: each micro-batch claims up to max_messages_per_batch messages of the
channel (relay/spark/batches.py): in flight under the batch's owner, so NSQ consumers of
the same channel never get them, with their records kept so that a batch Spark runs
again has the same messages. A batch is finished when Spark's checkpoint holds it as
done, which Spark shows by asking for the offsets after it. While the query lives its
claims are renewed; when it ends, what is not confirmed is parked for park_timeout,
for the next run to confirm or run again. availableNow takes what is queued at the start,
in batches, and confirms the last one before it ends.

Batch read: a snapshot of the channel's ready queue (not its in-flight or deferred
messages), read without taking anything. Write (batch and streaming): the `body` column
(binary or string) is published through publish.lua, like MPUB, in chunks.
"""

import datetime
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    DataSourceStreamWriter, DataSourceWriter, InputPartition,
                                    WriterCommitMessage)
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from relay.spark.batches import LEASE_MS, PARK_MS, QueryBatches

SCHEMA = ("id string, topic string, channel string, body binary, timestamp timestamp, "
          "attempts int")
PUBLISH_CHUNK = 500
SNAPSHOT_CHUNK = 1000
SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
JAVA_NEEDED = ("install Java 17 or 21 (e.g. apt-get install openjdk-17-jre-headless) "
               "and put its java on PATH or set JAVA_HOME to it")
log = logging.getLogger("relay.spark")


class JavaMissing(RuntimeError):
    """No Java runtime that Spark 4 can start: the message says what to install or set."""


def check_java() -> None:
    """Raise JavaMissing unless the java that pyspark's launcher would run (JAVA_HOME's,
    else PATH's) is there and is 17 or newer; call it before building a SparkSession,
    which otherwise dies with a Java gateway stack trace. A running gateway passes."""
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        return
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH"
        raise JavaMissing(f"no Java runtime for Spark 4 ({where}): {JAVA_NEEDED}")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    version = re.search(r'version "(?:1\.)?(\d+)', out)
    if not version or int(version.group(1)) < 17:
        said = out.splitlines()[0] if out else "no version"
        raise JavaMissing(f"no Java runtime for Spark 4 ({java}: {said}): {JAVA_NEEDED}")


class WorkerPythonUnfit(RuntimeError):
    """Spark's Python workers would run an interpreter that cannot import relay."""


def register(spark) -> None:
    """Make format("relay") available on this session, once its Python workers can
    import relay (else the first read fails 10 s later with a Java stack trace)."""
    check_worker_python(spark)
    spark.dataSource.register(RelayDataSource)


def check_worker_python(spark) -> None:
    """Raise WorkerPythonUnfit with one line saying what to set unless the Python that
    Spark starts its workers with (spark.pyspark.python, else PYSPARK_PYTHON, else
    python3 on PATH, as pyspark picks it) imports relay.spark."""
    python = (spark.conf.get("spark.pyspark.python", None)
              or os.environ.get("PYSPARK_PYTHON") or "python3")
    found = shutil.which(python)
    if found and subprocess.run([found, "-c", "import relay.spark"],
                                capture_output=True).returncode == 0:
        return
    said = f"{python} is not found" if not found else f"{found} cannot import relay.spark"
    raise WorkerPythonUnfit(f"Spark's Python workers would run {python}: {said}; "
                            f"set PYSPARK_PYTHON={sys.executable}")


def _store(options):
    """The options' Store; its publishes (the sink's) wait for `wait_replicas` replicas,
    for half of `redis_timeout` (ms) at most, as a broker's with those options."""
    from relay.options import Options
    from relay.store import Store, replication
    from relay.store.connection import connect
    timeout = int(options.get("redis_timeout", Options.redis_timeout))
    waiting = replication(Options(wait_replicas=int(options.get("wait_replicas", 0)),
                                  redis_timeout=timeout))
    return Store(connect(options.get("redis_url", "redis://127.0.0.1:6379/0")), **waiting)


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


class ChannelStream(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of claimed messages; offsets are {"batch": n}, the query's own batch
    numbers (relay/spark/batches.py). Spark calls every method but read() in one process
    of the driver that lives as long as the query: the first call starts the lease keeper
    there, and stop() parks what is not confirmed."""

    def __init__(self, options):
        self.options = dict(options)
        self.topic, self.channel = _required(options, "topic", "channel")
        self.consumer = options.get("consumer", "spark")
        self.limit = int(options.get("max_messages_per_batch", 1000))
        self.lease_ms = int(options.get("lease_timeout", LEASE_MS))
        self.park_ms = int(options.get("park_timeout", PARK_MS))
        self.available = None       # availableNow: how many messages this run may still claim
        self._query = None
        self._keeper = None

    def _batches(self) -> QueryBatches:
        return QueryBatches(_store(self.options), self.topic, self.channel, self.consumer,
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
        """availableNow: this run takes what is queued now, in batches of the read limit."""
        self.available = self._driver().store.read_channel(self.topic, self.channel)["depth"]

    def initialOffset(self) -> dict:
        return {"batch": self._driver().progress()["finished"]}

    def latestOffset(self, start: dict, limit) -> dict:
        """Spark asks for what follows `start` only once its checkpoint holds every batch
        up to `start` as done: confirm them. Then the batch a run claimed but did not get
        to plan, else a newly claimed one, else `start` again (nothing new); with
        ReadAllAvailable (Trigger.Once), everything queued."""
        query = self._driver()
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
            yield _row(self.topic, self.channel, record)

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
