"""An example pipeline on relay: JSON events from a topic, counts per key and time
window, written to another topic and to Parquet. The same file runs on local[2] and on
a cluster; only the master differs.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master 'local[2]' \\
        scripts/spark_pipeline.py --redis-url redis://127.0.0.1:6379/0 \\
        --topic events --out-topic event-counts --parquet var/event-counts

Events look like {"key": "checkout", ...}; the window is on the message's publish
time. Each micro-batch rewrites the Parquet folder with every window's count (the
complete result as of that batch, so a batch run again after a failure writes the same)
and publishes every count as a JSON line to --out-topic (a batch run again publishes
its lines again: keep the latest per window and key).
"""

import argparse
import sys

from pyspark.sql import SparkSession, functions as F

import relay.spark

EVENT_SCHEMA = "key string"


def counts(events, window: str):
    """Counts per (window, key) of a stream of relay rows with JSON bodies."""
    parsed = events.select(
        F.from_json(F.col("body").cast("string"), EVENT_SCHEMA).alias("event"),
        F.col("timestamp"))
    return (parsed.where(F.col("event.key").isNotNull())
            .groupBy(F.window("timestamp", window).alias("window"), F.col("event.key"))
            .count()
            .select(F.col("window.start").cast("string").alias("window_start"),
                    F.col("window.end").cast("string").alias("window_end"),
                    "key", "count"))


def write_batch(args):
    def write(batch, batch_id):
        batch.write.mode("overwrite").parquet(args.parquet)
        (batch.select(F.to_json(F.struct("window_start", "window_end", "key", "count"))
                      .alias("body"))
         .write.format("relay").option("redis_url", args.redis_url)
         .option("topic", args.out_topic).mode("append").save())
    return write


def run(args) -> None:
    builder = SparkSession.builder.appName("relay-event-counts")
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    relay.spark.register(spark)
    events = (spark.readStream.format("relay").option("redis_url", args.redis_url)
              .option("topic", args.topic).option("channel", args.channel)
              .option("max_messages_per_batch", args.batch)
              .option("lease_timeout", args.lease_timeout).load())
    writer = (counts(events, args.window).writeStream.outputMode("complete")
              .foreachBatch(write_batch(args))
              .option("checkpointLocation", args.checkpoint))
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    writer.start().awaitTermination()


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--topic", default="events")
    p.add_argument("--channel", default="event-counts")
    p.add_argument("--out-topic", default="event-counts")
    p.add_argument("--parquet", default="var/event-counts")
    p.add_argument("--checkpoint", default="var/event-counts.checkpoint")
    p.add_argument("--window", default="1 minute")
    p.add_argument("--batch", type=int, default=10_000, help="max messages per micro-batch")
    p.add_argument("--lease-timeout", type=int, default=60_000,
                   help="ms a claim lasts unless the running query renews it")
    p.add_argument("--master", default=None, help="e.g. local[2]; spark-submit's by default")
    p.add_argument("--available-now", action="store_true",
                   help="process what is there, then stop (else run until stopped)")
    return p.parse_args(argv)


if __name__ == "__main__":
    arguments = parse()
    try:
        relay.spark.check_java()
    except relay.spark.JavaMissing as missing:
        sys.exit(f"spark_pipeline: {missing}")
    run(arguments)
