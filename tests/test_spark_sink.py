"""The sink exactly once (relay/spark/sink.py, issue 39): a batch write done twice with
idColumn, a refusal without a dedup window, and a streaming query stopped mid-batch (killed -9, or a
failing partition) and restarted from its checkpoint. The SparkSession and the Java check are
tests/test_spark.py's."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.test_spark import HERE, SPARK_ENV, java, spark, store  # noqa: F401  (fixtures)
from tests.helpers.wait import wait_for
from workers.scanner import Scanner

pytestmark = pytest.mark.integration


def delivered_bodies(store, topic: str) -> list:
    [records] = store.deliver(topic, "check", [("x", 60_000, 100_000)])
    return [r[26:] for r in records]


@pytest.mark.cluster
def test_a_batch_write_with_an_id_column_done_twice_publishes_each_row_once(
        spark, store, redis_url):
    store.subscribe("out", "check", "")
    store.dedup.set_dedup("out", 600_000)
    df = spark.createDataFrame([("e1", "one"), ("e2", "two"), ("e1", "one again")],
                               "event_id string, body string")
    for _ in range(2):
        df.write.format("relay").option("redis_url", redis_url).option("topic", "out") \
            .option("idColumn", "event_id").mode("append").save()
    assert sorted(delivered_bodies(store, "out")) in ([b"one", b"two"], [b"one again", b"two"])
    assert store.reads.read_topic("out")["message_count"] == 2


def test_an_id_column_without_a_dedup_window_is_refused(spark, store, redis_url):
    df = spark.createDataFrame([("e1", "one")], "event_id string, body string")
    with pytest.raises(Exception) as refused:
        df.write.format("relay").option("redis_url", redis_url).option("topic", "out") \
            .option("idColumn", "event_id").mode("append").save()
    assert ("relay sink: topic out has no dedup window, so idColumn 'event_id' would not keep "
            "duplicates out: turn it on with relay-admin dedup out --window 10m") \
        in str(refused.value)
    assert store.reads.read_topic("out")["message_count"] == 0


STOPPING_QUERY = """
import os, sys, time
from pyspark.sql import SparkSession, functions as F
import relay.spark

url, checkpoint, gate, how = sys.argv[1:5]
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .getOrCreate())
relay.spark.register(spark)


def published():
    from relay.store import Store
    from relay.store.connection import connect
    return Store(connect(url)).reads.read_topic("out")["message_count"]


@F.udf("binary")
def stopping(body):
    # the row "stop" holds its partition until the gate is open (the driver is killed
    # meanwhile), or fails it, once the other partitions were published (their 800 rows)
    while bytes(body) == b"stop" and not os.path.exists(gate):
        if how == "fails" and published() >= 800:
            raise RuntimeError("this partition fails until the gate is open")
        time.sleep(0.1)
    return body


rows = (spark.readStream.format("relay").option("redis_url", url).option("topic", "events")
        .option("channel", "spark").option("max_messages_per_batch", 400)
        .option("lease_timeout", 2000).load())
(rows.select(stopping("body").alias("body")).writeStream.format("relay")
 .option("redis_url", url).option("topic", "out").option("checkpointLocation", checkpoint)
 .trigger(once=True).start().awaitTermination())
"""


def stopping_query(redis_url, tmp_path, how: str) -> subprocess.Popen:
    """The query of one micro-batch of 3 partitions (claims of 400; Trigger.Once takes
    them all), the third stopped `how` unless the gate is open."""
    return subprocess.Popen(
        [sys.executable, "-c", STOPPING_QUERY, redis_url, str(tmp_path / "ck"),
         str(tmp_path / "gate"), how], cwd=HERE, env=SPARK_ENV, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.parametrize("deployment, how", [("cluster", "killed"), ("redis", "fails")])
def test_a_streaming_query_stopped_mid_batch_and_restarted_publishes_each_row_once(
        java, store, redis_url, tmp_path, how):
    """Killed -9 (the driver's machine goes) or failed by a task, mid-batch: the batch
    Spark runs again from the checkpoint has the same keys, so the rows its first run
    published are duplicates. Each way once, on one deployment each (two Spark drivers
    take a minute a case; the sink's calls are the same on both)."""
    rows = [b"e%d" % i for i in range(1200)]
    rows[1000] = b"stop"
    store.subscribe("events", "spark", "")
    store.publish("events", rows)
    store.subscribe("out", "check", "")
    store.dedup.set_dedup("out", 600_000)
    driver = stopping_query(redis_url, tmp_path, how)
    try:
        published = lambda: store.reads.read_topic("out")["message_count"] == 800  # noqa: E731
        assert wait_for(published, timeout=300, interval=0.1)
        if how == "fails":
            assert driver.wait(300) != 0
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    assert store.reads.read_topic("out")["message_count"] == 800
    time.sleep(2.5)                     # past lease_timeout
    Scanner(store).scan_once()

    (tmp_path / "gate").touch()
    assert stopping_query(redis_url, tmp_path, how).wait(600) == 0
    assert store.reads.read_topic("out")["message_count"] == len(rows)
    assert sorted(delivered_bodies(store, "out")) == sorted(rows)
