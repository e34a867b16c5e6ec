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
messages), read without taking anything; with startingTimestamp or endingTimestamp, the
messages the topic retains in that range (relay/spark/history.py), with no channel. A
streaming query with startingTimestamp creates its channel from that time of the history.

Write (batch and streaming): the `body` column (binary or string) is published through
publish.lua, like MPUB, in chunks.
"""

import os
import re
import shutil
import subprocess
import sys

from pyspark.sql.datasource import DataSource

from relay.spark.history import HistoryRead
from relay.spark.sink import TopicStreamWriter, TopicWriter
from relay.spark.source import ChannelSnapshot, ChannelStream

SCHEMA = ("id string, topic string, channel string, body binary, timestamp timestamp, "
          "attempts int")
JAVA_NEEDED = ("install Java 17 or 21 (e.g. apt-get install openjdk-17-jre-headless) "
               "and put its java on PATH or set JAVA_HOME to it")


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


class RelayDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "relay"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema):
        """startingTimestamp or endingTimestamp: the topic's history, else the channel's."""
        if "startingtimestamp" in self.options or "endingtimestamp" in self.options:
            return HistoryRead(self.options)
        return ChannelSnapshot(self.options)

    def streamReader(self, schema):
        return ChannelStream(self.options)

    def writer(self, schema, overwrite):
        return TopicWriter(self.options)

    def streamWriter(self, schema, overwrite):
        return TopicStreamWriter(self.options)
