"""The PySpark connector against the embedded Redis (and the cluster, for tests marked
`cluster`), with a local[2] SparkSession. Spark drives every confirmation: no test
calls the source's methods itself."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

# Without pyspark or a Java runtime the module skips with one line saying what is
# missing; RELAY_REQUIRE_SPARK=1 (.ci/run sets it) makes each Spark test fail instead.
REQUIRE_SPARK = os.environ.get("RELAY_REQUIRE_SPARK") == "1"
if not REQUIRE_SPARK:
    pytest.importorskip("pyspark")

from relay.codec import record_id  # noqa: E402
import relay.spark  # noqa: E402
from relay.spark.batches import QueryBatches  # noqa: E402
from relay.store import Store  # noqa: E402
from relay.store.connection import connect  # noqa: E402
from tests.helpers.servers import flush  # noqa: E402
from tests.helpers.store import channel_state  # noqa: E402
from tests.helpers.wait import wait_for  # noqa: E402
from workers.scanner import Scanner  # noqa: E402

try:
    relay.spark.check_java()
    JAVA_MISSING = None
except relay.spark.JavaMissing as missing:
    JAVA_MISSING = str(missing)
if JAVA_MISSING and not REQUIRE_SPARK:
    pytest.skip(JAVA_MISSING, allow_module_level=True)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Each Spark driver here, the tests' own and those they start, runs seconds of work on
# tiny data: the JVM's C1 compiler alone starts it in half the time (a session 16 s ->
# 7 s on 2 cores), and 2 shuffle partitions rather than 200 spare the example
# pipeline's aggregation 198 empty tasks per batch (160 s -> 70 s for its two runs).
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SUBMIT_ARGS = (f'--driver-java-options "{JVM_OPTIONS}" --conf spark.ui.enabled=false '
               f'--conf spark.sql.shuffle.partitions=2 pyspark-shell')
SPARK_ENV = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_SUBMIT_ARGS": SUBMIT_ARGS}

pytestmark = pytest.mark.integration     # Spark: -m "not integration" leaves it out


@pytest.fixture(scope="module")
def java():
    """Under RELAY_REQUIRE_SPARK=1, no Java runtime fails each test that needs one."""
    if JAVA_MISSING:
        pytest.fail(JAVA_MISSING)


@pytest.fixture(scope="module")
def spark(java):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    given = os.environ.get("PYSPARK_SUBMIT_ARGS")
    os.environ["PYSPARK_SUBMIT_ARGS"] = SUBMIT_ARGS   # read when this process starts its JVM
    try:
        session = (SparkSession.builder.master("local[2]").appName("relay-tests")
                   .config("spark.ui.enabled", "false")
                   .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    finally:
        if given is None:
            del os.environ["PYSPARK_SUBMIT_ARGS"]
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = given
    relay.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def store(redis_url):
    """A Store on this test's deployment (one Redis, or the cluster), flushed."""
    flush(redis_url)
    return Store(connect(redis_url))


def source(spark, redis_url, batch=10, **extra):
    reader = (spark.readStream.format("relay").option("redis_url", redis_url)
              .option("topic", "events").option("channel", "spark")
              .option("max_messages_per_batch", batch))
    for key, value in extra.items():
        reader = reader.option(key, value)
    return reader.load()


# -- streaming queries --------------------------------------------------------------

@pytest.mark.cluster
def test_available_now_reads_each_message_once_and_leaves_nothing_in_flight(
        spark, store, redis_url, tmp_path):
    store.subscribe("events", "spark", "")
    store.publish("events", [b"m%02d" % i for i in range(30)])
    batches = {}
    query = (source(spark, redis_url).writeStream
             .foreachBatch(lambda df, batch_id: batches.update({batch_id: df.collect()}))
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    rows = [r for batch in batches.values() for r in batch]
    assert sorted(r.body for r in rows) == [b"m%02d" % i for i in range(30)]
    assert sorted(len(batch) for batch in batches.values()) == [10, 10, 10]
    assert {(r.topic, r.channel, r.attempts) for r in rows} == {("events", "spark", 1)}
    assert len({r.id for r in rows}) == 30 and rows[0].timestamp.year >= 2026
    assert channel_state(store) == (0, 0, 0)
    progress = QueryBatches(store, "events", "spark", "spark").progress()
    assert (progress["claimed"], progress["finished"]) == (3, 3)


def test_an_ordered_channel_is_read_one_message_per_key_per_batch_in_order(
        spark, store, redis_url, tmp_path):
    """A micro-batch claims at most one message of a key (the gate holds the rest), and
    the key's next is claimed only once Spark has confirmed it: a key's order holds
    across batches; a hot key drains one message per batch."""
    store.subscribe("events", "spark", "")
    store.ordering.set_ordered("events", "spark", True)
    keys = [k for _ in range(3) for k in (b"a", b"b", b"c")] + [None, None]
    store.dedup.publish_keyed("events", [b"%s%d" % (k, i // 3) if k else b"u%d" % i
                                   for i, k in enumerate(keys)], None, 0, keys)
    batches = {}
    query = (source(spark, redis_url).writeStream
             .foreachBatch(lambda df, batch_id: batches.update(
                 {batch_id: sorted(r.body for r in df.collect())}))
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert [batches[b] for b in sorted(batches)] == [
        [b"a0", b"b0", b"c0", b"u10", b"u9"], [b"a1", b"b1", b"c1"], [b"a2", b"b2", b"c2"]]
    assert channel_state(store) == (0, 0, 0)
    assert store.ordering.order_report("events", "spark")["keys_out"] == 0


@pytest.mark.cluster
def test_a_partitioned_topic_is_read_and_written_whole(spark, store, redis_url, tmp_path):
    """Source and sink cover every partition: 30 messages in 3 parts read once each;
    3,000 rows written by one task land in every part, each in the part its publish
    key's hash picks (relay/store/dedup.py)."""
    store.control.set_partitions("events", 3)
    store.subscribe("events", "spark", "")
    for i in range(30):
        store.publish("events", [b"p%02d" % i])
    assert [p["depth"] for p in store.reads.read_channel_parts("events", "spark")] == [10, 10, 10]
    read = []
    (source(spark, redis_url).writeStream
     .foreachBatch(lambda df, _: read.extend(r.body for r in df.collect()))
     .option("checkpointLocation", str(tmp_path / "ck"))
     .trigger(availableNow=True).start().awaitTermination(180))
    assert sorted(read) == [b"p%02d" % i for i in range(30)]
    assert channel_state(store) == (0, 0, 0)

    store.control.set_partitions("copied", 3)
    store.subscribe("copied", "c", "")
    rows = spark.createDataFrame([(f"r{i}",) for i in range(3000)], "body string").coalesce(1)
    rows.write.format("relay").option("redis_url", redis_url).option("topic", "copied") \
        .mode("append").save()
    depths = [p["depth"] for p in store.reads.read_channel_parts("copied", "c")]
    assert sum(depths) == 3000 and min(depths) > 850, depths   # crc32 spreads the keys


def test_a_failed_query_restarted_from_its_checkpoint_loses_nothing(spark, store, redis_url,
                                                                    tmp_path):
    store.subscribe("events", "spark", "")
    store.publish("events", [b"e%02d" % i for i in range(40)])
    seen, failed = [], []

    def sink(df, batch_id):
        bodies = sorted(r.body for r in df.collect())
        if not failed:
            failed.append((batch_id, bodies))
            raise RuntimeError("the sink fails once")
        seen.append((batch_id, bodies))

    def start(writer):
        return (writer.foreachBatch(sink)
                .option("checkpointLocation", str(tmp_path / "ck")).start())
    with pytest.raises(Exception, match="the sink fails once"):
        start(source(spark, redis_url).writeStream
              .trigger(processingTime="100 milliseconds")).awaitTermination(180)
    assert failed[0][0] == 0 and len(failed[0][1]) == 10
    assert channel_state(store) == (30, 10, 0)
    start(source(spark, redis_url).writeStream
          .trigger(availableNow=True)).awaitTermination(180)     # the same checkpoint
    assert seen[0] == failed[0]             # batch 0 again, with the same messages
    assert sorted(b for _, bodies in seen for b in bodies) == [b"e%02d" % i for i in range(40)]
    assert channel_state(store) == (0, 0, 0)


@pytest.mark.cluster
def test_a_query_stopped_mid_stream_keeps_its_batch_parked_until_it_runs_again(
        spark, store, redis_url, tmp_path):
    store.subscribe("events", "spark", "")
    store.publish("events", [b"q%02d" % i for i in range(30)])
    out, running, release = {}, threading.Event(), threading.Event()

    def sink(df, batch_id):             # idempotent per batch id
        out[batch_id] = sorted(r.body for r in df.collect())
        if batch_id == 1:
            running.set()
            release.wait(120)

    def start(trigger):
        return (source(spark, redis_url, lease_timeout=2000).writeStream.foreachBatch(sink)
                .option("checkpointLocation", str(tmp_path / "ck")).trigger(**trigger).start())
    query = start({"processingTime": "100 milliseconds"})
    assert running.wait(180)
    stopping = threading.Thread(target=query.stop)
    stopping.start()
    time.sleep(0.5)
    release.set()
    stopping.join(120)
    assert not query.isActive
    query_batches = QueryBatches(store, "events", "spark", "spark")
    # every batch claimed is parked: batches 0 and 1, or also 2 when Spark planned the
    # next batch before the stop took (under load it sometimes does)
    progress = {}
    assert wait_for(lambda: progress.update(query_batches.progress()) or (
        progress["claimed"] >= 2 and progress["parked"] == progress["claimed"]),
        timeout=60.0, interval=0.1), progress
    claimed, finished = progress["claimed"], progress["finished"]
    assert claimed in (2, 3) and finished >= 1
    time.sleep(2.5)                     # past lease_timeout
    Scanner(store).scan_once()
    assert channel_state(store) == (30 - 10 * claimed, 10 * (claimed - finished), 0)
    [nsq] = store.deliver("events", "spark", [("nsq", 60_000, 100)])
    assert len(nsq) == 30 - 10 * claimed
    assert not {r[26:] for r in nsq} & {b for bodies in out.values() for b in bodies}
    store.finish("events", "spark", [("nsq", record_id(r)) for r in nsq])

    start({"availableNow": True}).awaitTermination(180)
    assert sorted(out) == list(range(claimed))
    counted = Counter(b for bodies in out.values() for b in bodies)
    counted.update(r[26:] for r in nsq)
    assert counted == Counter(b"q%02d" % i for i in range(30))
    assert channel_state(store) == (0, 0, 0)


@pytest.mark.cluster
def test_a_batch_slower_than_the_lease_keeps_its_messages(spark, store, redis_url, tmp_path):
    store.subscribe("events", "spark", "")
    store.publish("events", [b"w%02d" % i for i in range(20)])
    seen, during = [], []

    def sink(df, batch_id):
        if batch_id == 0:
            time.sleep(4.5)             # three leases
            Scanner(store).scan_once()
            during.append(channel_state(store))
        seen.extend(r.body for r in df.collect())
    (source(spark, redis_url, lease_timeout=1500).writeStream.foreachBatch(sink)
     .option("checkpointLocation", str(tmp_path / "ck"))
     .trigger(availableNow=True).start().awaitTermination(180))
    assert during == [(10, 10, 0)]
    assert sorted(seen) == [b"w%02d" % i for i in range(20)]
    assert channel_state(store) == (0, 0, 0)


# -- batch read and write -----------------------------------------------------------

def test_snapshot_read_leaves_the_queue_alone(spark, store, redis_url):
    store.subscribe("events", "spark", "")
    store.publish("events", [b"a", b"b", b"c"])
    df = (spark.read.format("relay").option("redis_url", redis_url).option("topic", "events")
          .option("channel", "spark").load())
    assert sorted(r.body for r in df.collect()) == [b"a", b"b", b"c"]
    assert channel_state(store) == (3, 0, 0)


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
        assert store.reads.read_channel("out", channel)["depth"] == 3
    [records] = store.deliver("out", "one", [("x", 60_000, 10)])
    assert sorted(r[26:] for r in records) == [b"\x00\xff", b"more", b"text"]

    store.subscribe("events", "spark", "")
    store.publish("events", [b"p%d" % i for i in range(12)])
    query = (source(spark, redis_url).writeStream.format("relay")
             .option("redis_url", redis_url).option("topic", "piped")
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert store.reads.read_topic("piped")["message_count"] == 12


# -- the example pipeline (scripts/spark_pipeline.py) -------------------------------

def events(keys) -> list:
    return [json.dumps({"key": k}).encode() for k in keys]


def pipeline_args(redis_url, tmp_path) -> list:
    return ["--redis-url", redis_url, "--master", "local[2]", "--available-now",
            "--parquet", str(tmp_path / "counts"), "--checkpoint", str(tmp_path / "ck"),
            "--window", "1 hour", "--lease-timeout", "2000"]


def run_pipeline(redis_url, tmp_path) -> None:
    out = subprocess.run([sys.executable, os.path.join(HERE, "scripts", "spark_pipeline.py"),
                          *pipeline_args(redis_url, tmp_path)],
                         capture_output=True, text=True, timeout=600, env=SPARK_ENV)
    assert out.returncode == 0, out.stderr[-3000:]


def parquet_counts(tmp_path) -> dict:
    """Counts per key over all windows (the events may straddle an hour)."""
    import pyarrow.parquet as pq
    rows = pq.read_table(str(tmp_path / "counts")).to_pylist()
    assert len({(r["window_start"], r["key"]) for r in rows}) == len(rows)
    total = Counter()
    for r in rows:
        total[r["key"]] += r["count"]
    return dict(total)


def published_counts(store) -> dict:
    """The latest count published per window and key, summed per key."""
    [records] = store.deliver("event-counts", "check", [("x", 60_000, 1000)])
    latest = {}
    for r in records:
        row = json.loads(r[26:])
        latest[row["window_start"], row["key"]] = row["count"]
    total = Counter()
    for (_, key), count in latest.items():
        total[key] += count
    return dict(total)


def test_example_pipeline_run_twice_counts_each_event_once(java, store, redis_url, tmp_path):
    store.publish("events", events(["a"] * 5 + ["b"] * 3 + ["c"]))
    store.control.create_channel("events", "event-counts")
    store.publish("events", events(["a", "c"]) + [b"junk"])
    store.subscribe("event-counts", "check", "")
    run_pipeline(redis_url, tmp_path)
    assert parquet_counts(tmp_path) == {"a": 6, "b": 3, "c": 2}
    assert published_counts(store) == {"a": 6, "b": 3, "c": 2}
    assert channel_state(store, "event-counts") == (0, 0, 0)

    time.sleep(2.5)                     # past lease_timeout: nothing left to time out
    Scanner(store).scan_once()
    assert channel_state(store, "event-counts") == (0, 0, 0)
    store.publish("events", events(["b", "d"]))
    run_pipeline(redis_url, tmp_path)
    assert parquet_counts(tmp_path) == {"a": 6, "b": 4, "c": 2, "d": 1}
    assert published_counts(store) == {"a": 6, "b": 4, "c": 2, "d": 1}
    assert channel_state(store, "event-counts") == (0, 0, 0)


SLOW_PIPELINE = """
import pathlib, sys, time
from scripts import spark_pipeline

def write_batch(args):
    def write(batch, batch_id):
        pathlib.Path(sys.argv[1]).write_text(str(batch_id))
        time.sleep(3600)
    return write

spark_pipeline.write_batch = write_batch
spark_pipeline.run(spark_pipeline.parse(sys.argv[2:]))
"""


def test_example_pipeline_killed_mid_batch_counts_each_event_once(java, store, redis_url,
                                                                 tmp_path):
    store.control.create_channel("events", "event-counts")
    store.publish("events", events(["a"] * 4 + ["b"] * 2))
    writing = tmp_path / "writing"
    driver = subprocess.Popen(
        [sys.executable, "-c", SLOW_PIPELINE, str(writing), *pipeline_args(redis_url, tmp_path)],
        cwd=HERE, env=SPARK_ENV, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(writing.exists, timeout=300, interval=0.1)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)   # the driver's machine goes: nothing parks
        driver.wait()
    kept = QueryBatches(store, "events", "event-counts", "spark").records(1)
    assert len(kept) == 6
    time.sleep(2.5)                     # past lease_timeout
    Scanner(store).scan_once()
    assert channel_state(store, "event-counts") == (6, 0, 6)

    run_pipeline(redis_url, tmp_path)   # batch 0 again, from its kept records
    assert parquet_counts(tmp_path) == {"a": 4, "b": 2}
    assert channel_state(store, "event-counts") == (0, 0, 6)
