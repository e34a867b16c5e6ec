"""relay-admin's commands that change topics and channels: create (--partitions), pause,
unpause, empty, delete, requeue and config. empty, delete and requeue --all run inline
for targets of up to INLINE_LIMIT messages, else as an rq job (workers/operations.py)
that `relay jobs` runs, with a progress bar."""

import sys
import time

import click
from rq.job import JobStatus

from relay.admin.args import (background_option, existing, fail, parse_target, redis_options,
                              relay_options)
from relay.admin.text import show, summary, table
from relay.codec import MSG_ID_LENGTH, is_valid_name
from relay.options import option_source
from relay.store import Store
from relay.store import stats as relay_stats
from relay.store.causes import OUT_OF_MEMORY
from relay.store.control import PartitionsRefused
from relay.store.keys import MAX_PARTITIONS
from workers import operations

INLINE_LIMIT = 10_000
POLL = 0.1
ENDED = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED)


@click.command()
@click.argument("target", metavar="TOPIC[/CHANNEL]")
@click.argument("second", metavar="[CHANNEL]", required=False)
@click.option("--partitions", type=click.IntRange(1, MAX_PARTITIONS), metavar="N",
              help="a topic's partitions, each a slot of its own: a new topic gets N, an "
                   "existing one is raised to N (never lowered)")
@click.option("--from", "start", type=click.Choice(["latest", "earliest"]), default="latest",
              show_default=True, help="where a new channel starts: at what is published "
                                      "next (nsqd's), or with everything the topic retains")
@background_option
@redis_options
def create(store, as_json, target, second, partitions, start, background):
    """Create a topic, or a channel of an existing topic (as the HTTP API); a new topic
    gets --retention-time as the processes' options say."""
    if second is not None and "/" in target:
        raise click.UsageError("give TOPIC/CHANNEL or TOPIC CHANNEL, not both")
    topic, channel = parse_target(target if second is None else f"{target}/{second}")
    if start == "earliest" and not channel:
        raise click.UsageError("--from earliest is a new channel's: give TOPIC/CHANNEL")
    if channel and partitions:
        fail("--partitions is a topic's: give TOPIC, not TOPIC/CHANNEL")
    if channel and topic not in store.reads.topic_names():
        fail(f"topic {topic!r} not found: create it first (as /channel/create asks)")
    store.topic_retention_ms = relay_options()[0].retention_time
    if partitions:
        create_partitioned(store, as_json, topic, partitions)
        return
    if start == "earliest":
        create_from_start(store, as_json, topic, channel, background)
        return
    created = store.control.create_channel(topic, channel) if channel else store.control.create_topic(topic)
    show({"target": target, "created": created}, as_json,
         f"created {target}" if created else f"{target} exists already")


def create_from_start(store: Store, as_json: bool, topic: str, channel: str,
                      background: bool) -> None:
    """A new channel that starts with everything the topic retains (a replay, as an rq
    job when big)."""
    plan = store.history.create_from_start(topic, channel)
    if plan is None:
        fail(f"channel {topic}/{channel} exists already: --from earliest makes a new one "
             f"(relay-admin replay rewinds one)")
    run_operation(store, as_json, "replay", topic, channel, background, plan.size,
                  plan.params, lambda result: f"created {topic}/{channel} with the "
                  f"{result['replayed']} messages {topic} retains")


def create_partitioned(store: Store, as_json: bool, topic: str, partitions: int) -> None:
    created = topic not in store.reads.topic_names()
    try:
        before = store.control.set_partitions(topic, partitions)
    except PartitionsRefused as refused:
        fail(str(refused))
    if created:
        text = f"created {topic} with {partitions} partitions"
    elif before == partitions:
        text = f"{topic} has {partitions} partitions already"
    else:
        text = f"{topic}: {partitions} partitions (was {before})"
    show({"target": topic, "created": created, "partitions": partitions, "before": before},
         as_json, text)


@click.command()
@click.argument("target", metavar="TOPIC[/CHANNEL]")
@redis_options
def pause(store, as_json, target):
    """Pause a topic (it keeps what is published) or a channel (it delivers nothing)."""
    set_paused(store, as_json, target, True)


@click.command()
@click.argument("target", metavar="TOPIC[/CHANNEL]")
@redis_options
def unpause(store, as_json, target):
    """Unpause a topic or channel."""
    set_paused(store, as_json, target, False)


def set_paused(store: Store, as_json: bool, target: str, paused: bool) -> None:
    topic, channel = existing(store, target)
    if channel:
        store.control.pause_channel(topic, channel, paused)
    else:
        store.control.pause_topic(topic, paused)
        if paused and store.ordering.ordered_channels(topic):
            click.echo(f"relay-admin: {topic} has ordered channels: what is published while "
                       f"it is paused reaches them without order keys (a topic's backlog "
                       f"keeps none); pausing a channel keeps them", err=True)
    show({"target": target, "paused": paused}, as_json,
         f"{'paused' if paused else 'unpaused'} {target}")


@click.command()
@click.argument("target", metavar="TOPIC[/CHANNEL]")
@background_option
@redis_options
def empty(store, as_json, target, background):
    """Drop a channel's ready, in-flight and deferred messages, or a topic's backlog.
    What is published after the start stays."""
    topic, channel = existing(store, target)
    run_operation(store, as_json, "empty", topic, channel, background)


@click.command()
@click.argument("target", metavar="TOPIC[/CHANNEL]")
@background_option
@redis_options
def delete(store, as_json, target, background):
    """Delete a channel, or a topic with its channels, and everything in them."""
    topic, channel = existing(store, target)
    run_operation(store, as_json, "delete", topic, channel, background)


@click.command()
@click.argument("target", metavar="TOPIC/CHANNEL")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--all", "everything", is_flag=True,
              help="every message in flight when the command starts")
@background_option
@redis_options
def requeue(store, as_json, target, ids, everything, background):
    """Put in-flight messages back in the queue now, whoever holds them."""
    topic, channel = existing(store, target, channel_required=True)
    if everything == bool(ids):
        fail("give --all or message ids (not both)")
    if everything:
        run_operation(store, as_json, "requeue", topic, channel, background)
        return
    bad = [i for i in ids if len(i) != MSG_ID_LENGTH or i.strip("0123456789abcdef")]
    if bad:
        fail(f"invalid message id {bad[0]!r}: 16 hex digits")
    done = store.control.requeue_in_flight(topic, channel, [i.encode() for i in ids])
    missing = [i for i, d in zip(ids, done) if not d]
    show({"requeued": [i for i, d in zip(ids, done) if d], "not_in_flight": missing},
         as_json, table([[i, "requeued" if d else "not in flight"] for i, d in zip(ids, done)],
                        ["id", "result"]))
    if missing:
        fail(f"{len(missing)} of {len(ids)} messages were not in flight on {target}")


# the operations that free memory or only move data: at Redis' maxmemory, where rq cannot
# queue a job, they run inline (their functions run there: runner.REFUSED_AT_MAXMEMORY)
FREEING = ("empty", "delete", "requeue")


def run_operation(store: Store, as_json: bool, operation: str, topic: str,
                  channel: str | None, background: bool, size: int | None = None,
                  params: dict | None = None, text=summary) -> None:
    """Inline for small targets (`size` messages, by default what the target holds),
    else as an rq job with a progress bar; --background always queues a job and returns.
    `params`: the operation's own; `text(result)`: what is printed."""
    channel = channel or ""
    if background:
        job = operations.enqueue(store.redis, operation, topic, channel, store.replication(),
                                 params)
        show({"job": job.id, "status": "queued", "operation": operation,
              "target": operations.target(topic, channel)}, as_json,
             f"queued job {job.id}: {job.description} (relay-admin jobs shows it)")
        return
    if (held_messages(store, topic, channel) if size is None else size) <= INLINE_LIMIT:
        result = operations.run(store, operation, topic, channel, params=params)
    elif operation in FREEING and store.reads.refusal() == OUT_OF_MEMORY:
        click.echo(f"relay-admin: {OUT_OF_MEMORY}: no job can be queued, so the "
                   f"{operation} runs here", err=True)
        result = operations.run(store, operation, topic, channel, params=params)
    elif not operations.has_worker(store.redis):
        fail("no `relay jobs` worker is running: start one, or pass --background "
             "to queue the job")
    else:
        result = wait(operations.enqueue(store.redis, operation, topic, channel,
                                         store.replication(), params))
    show(result, as_json, text(result))


def held_messages(store: Store, topic: str, channel: str) -> int:
    [t] = relay_stats.collect(store, topic, channel)["topics"]
    return t["depth"] + t["deferred_count"] + sum(
        c["depth"] + c["in_flight_count"] + c["deferred_count"] for c in t["channels"])


def wait(job) -> dict:
    """A progress bar (on stderr) until the job ends; Ctrl-C stops waiting, not the job."""
    try:
        while "progress" not in job.meta and job.get_status() not in ENDED:
            time.sleep(POLL)
            job.refresh()
        total = job.meta.get("progress", {}).get("total", 0)
        with click.progressbar(length=max(total, 1), label=job.description,
                               file=sys.stderr) as bar:
            while True:
                bar.update(job.meta.get("progress", {}).get("done", 0) - bar.pos)
                if job.get_status() in ENDED:
                    break
                time.sleep(POLL)
                job.refresh()
    except KeyboardInterrupt:
        fail(f"stopped waiting; job {job.id} goes on (relay-admin jobs)")
    if job.get_status() != JobStatus.FINISHED:
        error = (job.latest_result().exc_string or "").strip().splitlines() or ["?"]
        fail(f"job {job.id} {job.get_status().value}: {error[-1]}")
    return job.return_value()


SETTINGS = {"max-attempts": "max_attempts", "dead-letter-topic": "dead_letter_topic"}


@click.command()
@click.argument("target", metavar="TOPIC/CHANNEL")
@click.argument("name", required=False, type=click.Choice(sorted(SETTINGS)))
@click.argument("value", required=False)
@click.option("--unset", is_flag=True, help="back to the brokers' and scanners' option")
@redis_options
def config(store, as_json, target, name, value, unset):
    """Show a channel's settings in force and where each comes from, or set one:
    max-attempts N (0: unlimited) overrides --max-attempts, dead-letter-topic NAME
    overrides --dead-letter-topic."""
    topic, channel = existing(store, target, channel_required=True)
    if name and not unset:
        if value is None:
            fail(f"give a value for {name}, or --unset")
        store.control.configure_channel(topic, channel, SETTINGS[name], setting_value(name, value))
    elif name:
        store.control.configure_channel(topic, channel, SETTINGS[name], None)
    options, config_path = relay_options()
    current = {}
    for flag, field in SETTINGS.items():
        own = store.reads.channel_setting(topic, channel, field)
        value, source = (own, "channel setting") if own is not None else \
            (getattr(options, field), option_source(field, config_path))
        current[flag] = {"value": int(value) if field == "max_attempts"
                         else value.format(topic=topic), "source": source}
    show(current, as_json, table([[k, v["value"], v["source"]] for k, v in current.items()],
                                 ["setting", "value", "source"]))


def setting_value(name: str, value: str) -> str:
    if name == "max-attempts":
        if not value.isdigit() or int(value) > 65535:
            fail(f"max-attempts must be a whole number 0-65535, not {value!r}")
        return str(int(value))
    if not is_valid_name(value):
        fail(f"invalid topic name {value!r}")
    return value
