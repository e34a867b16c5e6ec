"""The PySpark connector against the embedded Redis, with a local[2] SparkSession."""

import json
import os
import subprocess
import sys
import time

import pytest

pyspark = pytest.importorskip("pyspark")

import relay.spark  # noqa: E402
from relay.spark import ChannelStream  # noqa: E402
from relay.store import Store  # noqa: E402
from relay.store.connection import connect  # noqa: E402
from tests.helpers.servers import flush  # noqa: E402
from workers.scanner import Scanner  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master("local[2]").appName("relay-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    relay.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def store(redis_url):
    flush(redis_url)
    return Store(connect(redis_url))


def source(spark, redis_url, batch=10, **extra):
    reader = (spark.readStream.format("relay").option("redis_url", redis_url)
              .option("topic", "events").option("channel", "spark")
              .option("max_messages_per_batch", batch))
    for key, value in extra.items():
        reader = reader.option(key, value)
    return reader.load()


@pytest.mark.cluster
def test_stream_claims_batches_and_finishes_them_on_commit(spark, store, redis_url, tmp_path):
    store.subscribe("events", "spark", "")
    store.publish("events", [b"m%02d" % i for i in range(30)])
    rows = []
    query = (source(spark, redis_url).writeStream
             .foreachBatch(lambda df, _: rows.extend(df.collect()))
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert sorted(r.body for r in rows) == [b"m%02d" % i for i in range(30)]
    assert {(r.topic, r.channel, r.attempts) for r in rows} == {("events", "spark", 1)}
    assert len({r.id for r in rows}) == 30 and rows[0].timestamp.year >= 2026
    ChannelStream({"redis_url": redis_url, "topic": "events", "channel": "spark"}).commit(
        {"batch": 3})
    state = store.read_channel("events", "spark")
    assert (state["depth"], state["in_flight_count"]) == (0, 0)


def test_a_failed_query_restarted_from_its_checkpoint_loses_nothing(spark, store, redis_url,
                                                                    tmp_path):
    store.subscribe("events", "spark", "")
    store.publish("events", [b"e%02d" % i for i in range(40)])
    seen, failures = [], []

    def sink(df, batch_id):
        if not failures:
            failures.append(batch_id)
            raise RuntimeError("the sink fails once")
        seen.extend(r.body for r in df.collect())

    def start():
        return (source(spark, redis_url).writeStream.foreachBatch(sink)
                .option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(processingTime="100 milliseconds").start())
    with pytest.raises(Exception, match="the sink fails once"):
        start().awaitTermination(120)
    assert failures == [0]
    assert store.read_channel("events", "spark")["in_flight_count"] == 10
    query = start()                 # from the same checkpoint
    deadline = time.monotonic() + 90
    while len(set(seen)) < 40 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)                 # a trigger more, so the last batch is finished
    query.stop()
    assert sorted(set(seen)) == [b"e%02d" % i for i in range(40)]
    assert len(seen) == 40          # the failed batch ran again with the same messages
    state = store.read_channel("events", "spark")
    assert (state["depth"], state["timeout_count"]) == (0, 0)


def test_claims_of_a_dead_query_come_back_after_the_lease(store, redis_url):
    store.subscribe("events", "spark", "")
    store.publish("events", [b"x%d" % i for i in range(5)])
    stream = ChannelStream({"redis_url": redis_url, "topic": "events", "channel": "spark",
                            "lease_timeout": "300"})
    assert stream.latestOffset({"batch": 0}) == {"batch": 1}
    assert store.read_channel("events", "spark")["in_flight_count"] == 5
    time.sleep(0.4)
    Scanner(store).scan_once()
    state = store.read_channel("events", "spark")
    assert (state["depth"], state["in_flight_count"], state["timeout_count"]) == (5, 0, 5)


def test_nsq_consumers_and_spark_share_a_channel(store, redis_url):
    store.subscribe("events", "spark", "b1")
    store.publish("events", [b"s%d" % i for i in range(6)])
    stream = ChannelStream({"redis_url": redis_url, "topic": "events", "channel": "spark",
                            "max_messages_per_batch": "4"})
    stream.latestOffset({"batch": 0})
    [others] = store.deliver("events", "spark", [("b1:1", 60_000, 10)])
    claimed = store.spark_batch("events", "spark", "spark", 1)
    assert len(claimed) == 4 and len(others) == 2
    assert not set(claimed) & set(others)


def test_snapshot_read_leaves_the_queue_alone(spark, store, redis_url):
    store.subscribe("events", "spark", "")
    store.publish("events", [b"a", b"b", b"c"])
    df = (spark.read.format("relay").option("redis_url", redis_url).option("topic", "events")
          .option("channel", "spark").load())
    assert sorted(r.body for r in df.collect()) == [b"a", b"b", b"c"]
    state = store.read_channel("events", "spark")
    assert (state["depth"], state["in_flight_count"]) == (3, 0)


@pytest.mark.cluster
def test_sink_publishes_to_every_channel(spark, store, redis_url, tmp_path):
    for channel in ("one", "two"):
        store.subscribe("out", channel, "")
    df = spark.createDataFrame([("text",), ("more",)], "body string")
    df.write.format("relay").option("redis_url", redis_url).option("topic", "out") \
        .mode("append").save()
    binary = spark.createDataFrame([(bytearray(b"\x00\xff"),)], "body binary")
    binary.write.format("relay").option("redis_url", redis_url).option("topic", "out") \
        .mode("append").save()
    for channel in ("one", "two"):
        assert store.read_channel("out", channel)["depth"] == 3
    [records] = store.deliver("out", "one", [("x", 60_000, 10)])
    assert sorted(r[26:] for r in records) == [b"\x00\xff", b"more", b"text"]

    store.subscribe("events", "spark", "")
    store.publish("events", [b"p%d" % i for i in range(12)])
    query = (source(spark, redis_url).writeStream.format("relay")
             .option("redis_url", redis_url).option("topic", "piped")
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert store.read_topic("piped")["message_count"] == 12


def test_example_pipeline_counts_per_key_and_window(store, redis_url, tmp_path):
    store.publish("events", [json.dumps({"key": k}).encode()
                             for k in ["a"] * 5 + ["b"] * 3 + ["c"]])
    store.create_channel("events", "event-counts")
    store.publish("events", [json.dumps({"key": k}).encode() for k in ["a", "c"]] + [b"junk"])
    store.subscribe("event-counts", "check", "")
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "scripts", "spark_pipeline.py"),
         "--redis-url", redis_url, "--master", "local[2]", "--available-now",
         "--parquet", str(tmp_path / "counts"), "--checkpoint", str(tmp_path / "ck"),
         "--window", "1 hour"],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert out.returncode == 0, out.stderr[-3000:]
    import pyarrow.parquet as pq
    table = pq.read_table(str(tmp_path / "counts")).to_pylist()
    assert sorted((r["key"], r["count"]) for r in table) in (
        [("a", 6), ("b", 3), ("c", 2)],                 # one window
        sorted([("a", 6), ("b", 3), ("c", 2)]))
    [records] = store.deliver("event-counts", "check", [("x", 60_000, 100)])
    latest = {}
    for r in records:
        row = json.loads(r[26:])
        latest[row["key"]] = row["count"]
    assert latest == {"a": 6, "b": 3, "c": 2}
