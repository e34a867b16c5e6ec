"""A topic's retained history read by Spark (relay/spark/history.py): a time range as a
batch, with no channel touched, and a streaming query that starts from a time. The
SparkSession and the Java check are tests/test_spark.py's."""

import datetime

import pytest

from tests.test_spark import java, spark, store  # noqa: F401  (fixtures)
from relay.codec import parse_record
from relay.store.history import iso_ms
from relay.store.keys import TopicKeys
from tests.helpers.store import channel_state

pytestmark = pytest.mark.integration

DAY_MS = 24 * 3600 * 1000


def publish_at(store, base_ms: int, parts: int, count: int) -> dict:
    """Message k of part p published at base_ms + k s + p ms; {(p, k): its row}."""
    rows = {}
    for k in range(count):
        for p in range(parts):
            ms = base_ms + 1000 * k + p
            body = b"p%d-%d" % (p, k)
            n = store.run(store.publish_op("events", [body], timestamp_ns=ms * 10**6, index=p))
            moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
            rows[p, k] = (f"{p:04x}{n:012x}", "events", None, body,
                          moment.replace(tzinfo=None), 0)
    return rows


def history(spark, redis_url, **times):
    reader = spark.read.format("relay").option("redis_url", redis_url).option("topic", "events")
    for name, value in times.items():
        reader = reader.option(name, value)
    return [tuple(r) for r in reader.load().collect()]


@pytest.mark.cluster
def test_a_time_range_is_read_per_partition_in_order_without_touching_a_channel(
        spark, store, redis_url):
    store.control.set_partitions("events", 2)
    store.subscribe("events", "audit", "")
    store.history.set_retention("events", DAY_MS, 0)
    base = store.now_ms() - 600_000
    rows = publish_at(store, base, parts=2, count=6)

    got = history(spark, redis_url, startingTimestamp=iso_ms(base + 1000),
                  endingTimestamp=str(base + 4000))      # ISO 8601, then ms; the end excluded
    assert got == [rows[0, 1], rows[0, 2], rows[0, 3], rows[1, 1], rows[1, 2], rows[1, 3]]
    assert history(spark, redis_url, startingTimestamp=str(base + 4001)) == [
        rows[0, 5], rows[1, 4], rows[1, 5]]
    assert history(spark, redis_url, startingTimestamp=str(base + 60_000)) == []
    assert history(spark, redis_url, endingTimestamp=str(base)) == []

    assert channel_state(store, "audit") == (12, 0, 0)
    for part in store.parts("events"):
        assert store.redis.smembers(TopicKeys.of(part).channels) == {b"audit"}


def test_the_store_reads_a_range_in_bounded_chunks(store):
    """What the Spark partitions read (Store.history_records), both ends inclusive."""
    store.subscribe("events", "audit", "")
    store.history.set_retention("events", DAY_MS, 0)
    base = store.now_ms() - 600_000
    publish_at(store, base, parts=1, count=6)
    chunks = store.history.history_records("events", base + 1000, base + 4000, chunk=2)
    assert [[parse_record(r)[3] for r in c] for c in chunks] == [
        [b"p0-1", b"p0-2"], [b"p0-3", b"p0-4"]]


def test_a_topic_without_retention_and_bad_times_are_refused_in_one_line(
        spark, store, redis_url, tmp_path):
    store.publish("events", [b"x"])
    with pytest.raises(Exception) as refused:
        history(spark, redis_url, startingTimestamp="0")
    assert ("topic events keeps no history: retention is off (relay-admin retention events "
            "--time 24h turns it on)") in str(refused.value)
    with pytest.raises(Exception) as refused:
        history(spark, redis_url, startingTimestamp="yesterday")
    assert ("relay data source option startingTimestamp='yesterday' is not a time: give ms "
            "since the epoch or ISO 8601 (e.g. 2026-11-25T10:00:00Z)") in str(refused.value)
    with pytest.raises(Exception) as refused:
        history(spark, redis_url, startingTimestamp="2000", endingTimestamp="1000")
    assert ("relay data source option endingTimestamp (1970-01-01T00:00:01.000Z) must be "
            "after startingTimestamp (1970-01-01T00:00:02.000Z)") in str(refused.value)

    def stream(tmp_path, **times):
        reader = (spark.readStream.format("relay").option("redis_url", redis_url)
                  .option("topic", "events").option("channel", "spark"))
        for name, value in times.items():
            reader = reader.option(name, value)
        (reader.load().writeStream.foreachBatch(lambda df, _: None)
         .option("checkpointLocation", str(tmp_path)).trigger(availableNow=True).start()
         .awaitTermination(180))
    with pytest.raises(Exception) as refused:
        stream(tmp_path / "one", startingTimestamp="0")
    assert "topic events keeps no history: retention is off" in str(refused.value)
    assert store.redis.smembers(TopicKeys.of("events").channels) == set()
    with pytest.raises(Exception) as refused:
        stream(tmp_path / "two", endingTimestamp="0")
    assert ("relay data source: endingTimestamp is a batch read's; a streaming query takes "
            "only startingTimestamp") in str(refused.value)


def test_a_streaming_query_starts_from_a_time_then_reads_what_follows(
        spark, store, redis_url, tmp_path):
    """Its channel is made from startingTimestamp: the history from then on, then what is
    published after, each once; a run from the checkpoint goes on where it was."""
    store.subscribe("events", "audit", "")
    store.history.set_retention("events", DAY_MS, 0)
    base = store.now_ms() - 600_000
    rows = publish_at(store, base, parts=1, count=6)
    read = []

    def run():
        (spark.readStream.format("relay").option("redis_url", redis_url)
         .option("topic", "events").option("channel", "spark")
         .option("max_messages_per_batch", 3).option("startingTimestamp", str(base + 2000))
         .load().writeStream
         .foreachBatch(lambda df, _: read.extend(tuple(r)[:4] for r in df.collect()))
         .option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start().awaitTermination(180))
    run()
    assert read == [(*rows[0, k][:2], "spark", rows[0, k][3]) for k in (2, 3, 4, 5)]
    store.publish("events", [b"later"])
    run()
    assert [r[3] for r in read] == [b"p0-2", b"p0-3", b"p0-4", b"p0-5", b"later"]
    assert channel_state(store) == (0, 0, 0)
