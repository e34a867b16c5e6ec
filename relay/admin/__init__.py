"""`relay-admin`: inspect and steer relay's state straight in Redis.

Every command prints an aligned table (or one line) and takes --json; it exits 0 on
success, 1 with one line on stderr on an error and 2 with one line on a usage error.
empty, delete, requeue --all and redrive run as rq jobs (workers/operations.py) when the target
holds more than INLINE_LIMIT messages.
"""

import json
import sys
import tempfile
import time

import click
from rq.job import JobStatus

from relay.broker import registry
from relay.store import deadletter
from relay.store import stats as relay_stats
from workers import operations
from relay.admin.args import (REDIS_ENV, AdminGroup, background_option, existing, fail,
                              parse_target, redis_options, relay_options, replicated)
from relay.admin.text import (clients_table, percent, preview, show, stats_text, summary,
                               table, utc)
from relay.codec import MSG_ID_LENGTH, is_valid_name
from relay.options import DEFAULT_CONFIG, Options, option_source
from relay.store import Store
from relay.store.keys import MAX_PARTITIONS
from relay.store.control import PartitionsRefused
from relay.admin.tail import Tail, TailError

INLINE_LIMIT = 10_000
POLL = 0.1
PUB_BATCH = 1000
PUB_BATCH_BYTES = 1 << 20
PUB_SPOOL_BYTES = 64 << 20      # pub's input is kept in memory up to this, then on disk
CLEAR = "\x1b[H\x1b[J"
ENDED = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED)


@click.group(cls=AdminGroup)
@click.option("--redis-url", envvar=REDIS_ENV, default=Options.redis_url, show_default=True,
              show_envvar=True, metavar="URL", help="Redis holding relay's state")
@click.option("--config", type=click.Path(dir_okay=False),
              help=f"relay's TOML config file, for the options pub and config read "
                   f"(default: RELAY_CONFIG, else {DEFAULT_CONFIG} if present)")
def main(redis_url, config):
    """Inspect and steer relay (topics, channels and messages in Redis)."""


# -- reading -------------------------------------------------------------------------


@main.command()
@redis_options
def topics(store, as_json):
    """Topics, their number of channels, and whether they are paused."""
    rows = [{"topic": t["topic_name"], "channels": len(t["channels"]), "paused": t["paused"]}
            for t in relay_stats.collect(store)["topics"]]
    show({"topics": rows}, as_json,
         table([list(r.values()) for r in rows], ["topic", "channels", "paused"])
         if rows else "no topics")


@main.command()
@click.argument("topic")
@redis_options
def channels(store, as_json, topic):
    """Channels of a topic, their clients (on every broker), and whether they are paused."""
    existing(store, topic)
    [t] = stats_with_clients(store, topic, None)["topics"]
    rows = [{"channel": c["channel_name"], "clients": c["client_count"], "paused": c["paused"]}
            for c in t["channels"]]
    show({"topic": topic, "channels": rows}, as_json,
         table([list(r.values()) for r in rows], ["channel", "clients", "paused"])
         if rows else f"{topic} has no channels")


@main.command()
@click.argument("target", required=False, metavar="[TOPIC[/CHANNEL]]")
@click.option("--watch", type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="redraw every SECONDS until Ctrl-C (with --json: one line each time)")
@click.option("--partitions", "by_part", is_flag=True,
              help="each partition's figures too, under its topic and channels")
@redis_options
def stats(store, as_json, target, watch, by_part):
    """Depth, in-flight, deferred, counters, paused and clients of topics and channels
    (summed over a topic's partitions), with the clients of every live broker."""
    topic, channel = existing(store, target)
    if not watch:
        data = stats_with_clients(store, topic, channel, by_part)
        show(data, as_json, stats_text(data))
        return
    try:
        while True:
            data = stats_with_clients(store, topic, channel, by_part)
            click.echo(json.dumps(data) if as_json else CLEAR + stats_text(data))
            time.sleep(watch)
    except KeyboardInterrupt:
        pass


def stats_with_clients(store: Store, topic, channel, by_part: bool = False) -> dict:
    """relay/store/stats.py's figures, each channel with the clients live brokers announced and
    their number as client_count (rather than the channel's consumer counts, which keep
    those of a broker killed with -9), so the table counts the clients it lists."""
    data = relay_stats.collect(store, topic, channel, by_part=by_part)
    clients = registry.live_clients(store.redis, registry.live_brokers(store.redis))
    for t in data["topics"]:
        for c in t["channels"]:
            c["clients"] = [client for client in clients
                            if (client["topic"], client["channel"]) ==
                            (t["topic_name"], c["channel_name"])]
            c["client_count"] = len(c["clients"])
    return data


@main.command()
@redis_options
def brokers(store, as_json):
    """Live brokers (from the registry) and the clients each has subscribed."""
    live = registry.live_brokers(store.redis)
    clients = registry.live_clients(store.redis, live)
    data = [{**b, "clients": [c for c in clients if c["broker"] == b["id"]]} for b in live]
    rows = [[b["id"], b["remote_address"], b["http_port"], b["version"], len(b["clients"])]
            for b in data]
    text = table(rows, ["broker", "address", "http_port", "version", "clients"])
    if clients:
        text += "\n\n" + clients_table(clients)
    show({"brokers": data}, as_json, text if live else "no live brokers")


@main.command()
@click.argument("target", metavar="TOPIC/CHANNEL")
@click.option("-n", "--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="show the messages due first, at most this many")
@redis_options
def inflight(store, as_json, target, limit):
    """Messages in flight: id, attempts, delivery time, deadline, owner broker and client."""
    topic, channel = existing(store, target, channel_required=True)
    total = store.read_channel(topic, channel)["in_flight_count"]
    clients = {c["owner"]: c for c in registry.live_clients(
        store.redis, registry.live_brokers(store.redis))}
    rows = []
    for m in relay_stats.in_flight(store, topic, channel, limit):
        broker, _, number = m["owner"].rpartition(":")
        client = clients.get(m["owner"], {})
        rows.append({"id": m["id"], "attempts": m["attempts"], "delivered": m["delivered_ms"],
                     "deadline": m["deadline_ms"], "broker": broker, "connection": int(number),
                     "client": client.get("remote_address")})
    text = table([[r["id"], r["attempts"], utc(r["delivered"]), utc(r["deadline"]),
                   r["broker"], r["client"] or f"#{r['connection']}"] for r in rows],
                 ["id", "attempts", "delivered", "deadline", "broker", "client"])
    if total > len(rows):
        text += f"\n({len(rows)} of {total} shown, those due first)"
    show({"in_flight_count": total, "messages": rows}, as_json,
         text if rows else f"nothing in flight on {target}")


@main.command("jobs")
@redis_options
def list_jobs(store, as_json):
    """rq jobs of relay-admin (queue "relay"), oldest first, with state and progress."""
    rows = []
    for job in operations.all_jobs(store.redis):
        progress = job.meta.get("progress", {})
        rows.append({"job": job.id, "operation": job.meta.get("operation"),
                     "target": job.meta.get("target"),
                     "state": job.get_status(refresh=False).value,
                     "done": progress.get("done"), "total": progress.get("total"),
                     "enqueued_at": job.enqueued_at and job.enqueued_at.isoformat(),
                     "ended_at": job.ended_at and job.ended_at.isoformat()})
    show({"jobs": rows}, as_json,
         table([[r["job"], r["operation"], r["target"], r["state"], percent(r)]
                for r in rows], ["job", "operation", "target", "state", "progress"])
         if rows else "no jobs")


# -- changing --------------------------------------------------------------------------


@main.command()
@click.argument("target", metavar="TOPIC[/CHANNEL]")
@click.option("--partitions", type=click.IntRange(1, MAX_PARTITIONS), metavar="N",
              help="a topic's partitions, each a slot of its own: a new topic gets N, an "
                   "existing one is raised to N (never lowered)")
@redis_options
def create(store, as_json, target, partitions):
    """Create a topic, or a channel of an existing topic (as the HTTP API)."""
    topic, channel = parse_target(target)
    if channel and partitions:
        fail("--partitions is a topic's: give TOPIC, not TOPIC/CHANNEL")
    if channel and topic not in store.topic_names():
        fail(f"topic {topic!r} not found: create it first (as /channel/create asks)")
    if partitions:
        create_partitioned(store, as_json, topic, partitions)
        return
    created = store.create_channel(topic, channel) if channel else store.create_topic(topic)
    show({"target": target, "created": created}, as_json,
         f"created {target}" if created else f"{target} exists already")


def create_partitioned(store: Store, as_json: bool, topic: str, partitions: int) -> None:
    created = topic not in store.topic_names()
    try:
        before = store.set_partitions(topic, partitions)
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


@main.command()
@click.argument("target", metavar="TOPIC[/CHANNEL]")
@redis_options
def pause(store, as_json, target):
    """Pause a topic (it keeps what is published) or a channel (it delivers nothing)."""
    set_paused(store, as_json, target, True)


@main.command()
@click.argument("target", metavar="TOPIC[/CHANNEL]")
@redis_options
def unpause(store, as_json, target):
    """Unpause a topic or channel."""
    set_paused(store, as_json, target, False)


def set_paused(store: Store, as_json: bool, target: str, paused: bool) -> None:
    topic, channel = existing(store, target)
    if channel:
        store.pause_channel(topic, channel, paused)
    else:
        store.pause_topic(topic, paused)
    show({"target": target, "paused": paused}, as_json,
         f"{'paused' if paused else 'unpaused'} {target}")


@main.command()
@click.argument("target", metavar="TOPIC[/CHANNEL]")
@background_option
@redis_options
def empty(store, as_json, target, background):
    """Drop a channel's ready, in-flight and deferred messages, or a topic's backlog.
    What is published after the start stays."""
    topic, channel = existing(store, target)
    run_operation(store, as_json, "empty", topic, channel, background)


@main.command()
@click.argument("target", metavar="TOPIC[/CHANNEL]")
@background_option
@redis_options
def delete(store, as_json, target, background):
    """Delete a channel, or a topic with its channels, and everything in them."""
    topic, channel = existing(store, target)
    run_operation(store, as_json, "delete", topic, channel, background)


@main.command()
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
    done = store.requeue_in_flight(topic, channel, [i.encode() for i in ids])
    missing = [i for i, d in zip(ids, done) if not d]
    show({"requeued": [i for i, d in zip(ids, done) if d], "not_in_flight": missing},
         as_json, table([[i, "requeued" if d else "not in flight"] for i, d in zip(ids, done)],
                        ["id", "result"]))
    if missing:
        fail(f"{len(missing)} of {len(ids)} messages were not in flight on {target}")


def run_operation(store: Store, as_json: bool, operation: str, topic: str,
                  channel: str | None, background: bool, size: int | None = None) -> None:
    """Inline for small targets (`size` messages, by default what the target holds),
    else as an rq job with a progress bar; --background always queues a job and returns."""
    channel = channel or ""
    if background:
        job = operations.enqueue(store.redis, operation, topic, channel, store.replication())
        show({"job": job.id, "status": "queued", "operation": operation,
              "target": operations.target(topic, channel)}, as_json,
             f"queued job {job.id}: {job.description} (relay-admin jobs shows it)")
        return
    if (held_messages(store, topic, channel) if size is None else size) <= INLINE_LIMIT:
        result = operations.run(store, operation, topic, channel)
    elif not operations.has_worker(store.redis):
        fail("no `relay jobs` worker is running: start one, or pass --background "
             "to queue the job")
    else:
        result = wait(operations.enqueue(store.redis, operation, topic, channel,
                                   store.replication()))
    show(result, as_json, summary(result))


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


@main.command()
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
        store.configure_channel(topic, channel, SETTINGS[name], setting_value(name, value))
    elif name:
        store.configure_channel(topic, channel, SETTINGS[name], None)
    options, config_path = relay_options()
    current = {}
    for flag, field in SETTINGS.items():
        own = store.channel_setting(topic, channel, field)
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


@main.command()
@click.argument("target", metavar="TOPIC/CHANNEL")
@click.option("-n", "--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="show at most this many")
@redis_options
def dlq(store, as_json, target, limit):
    """Dead letters of a channel waiting in its dead-letter topic: id, attempts, first
    published, reason and body."""
    topic, channel = existing(store, target, channel_required=True)
    seen, rows = set(), []
    for _, _, letter in deadletter.letters(store, topic, channel):
        if letter["id"] in seen:
            continue
        seen.add(letter["id"])
        rows.append({k: letter[k] for k in ("id", "attempts", "timestamp", "reason")}
                    | {"body": letter.get("body", letter.get("body_base64"))})
        if len(rows) == limit:
            break
    text = table([[r["id"], r["attempts"], utc(r["timestamp"] // 1_000_000), r["reason"],
                   preview(r["body"])] for r in rows],
                 ["id", "attempts", "published", "reason", "body"]) if rows \
        else f"no dead letters for {target}"
    show(rows, as_json, text)


@main.command()
@click.argument("target", metavar="TOPIC/CHANNEL")
@background_option
@redis_options
def redrive(store, as_json, target, background):
    """Queue a channel's dead letters on it again (attempts start over) and remove them
    from the dead-letter topic."""
    topic, channel = existing(store, target, channel_required=True)
    size = sum(1 for _ in deadletter.letters(store, topic, channel))
    run_operation(replicated(store), as_json, "redrive", topic, channel, background, size)


@main.command()
@click.argument("topic")
@click.option("--file", "source", type=click.File("rb"), default="-",
              help="read the messages from this file instead of stdin")
@redis_options
def pub(store, as_json, topic, source):
    """Publish each non-empty line of stdin (or --file) as a message, in batches of at
    most --max-body-size; a line over --max-msg-size is refused and, as nsqd's /mpub,
    nothing is published."""
    parse_target(topic)
    options, _ = relay_options()
    store = replicated(store)
    with tempfile.SpooledTemporaryFile(PUB_SPOOL_BYTES) as lines:
        refused = []
        for number, line in enumerate(source, 1):
            size = len(line.rstrip(b"\r\n"))
            if size > options.max_msg_size:
                refused.append((number, size))
            lines.write(line if line.endswith(b"\n") else line + b"\n")
        for number, size in refused:
            click.echo(f"relay-admin: line {number}: {size} bytes, over --max-msg-size "
                       f"{options.max_msg_size} (MSG_TOO_BIG): nothing published", err=True)
        if refused:
            sys.exit(1)
        lines.seek(0)
        count = 0
        for batch in batches(lines, min(PUB_BATCH_BYTES, options.max_body_size)):
            store.publish(topic, batch)
            count += len(batch)
    show({"topic": topic, "published": count}, as_json, f"published {count} messages to {topic}")


def batches(lines, limit: int):
    """Non-empty lines without their line end, PUB_BATCH at a time and at most `limit`
    bytes as /mpub's body (a newline each), or one line alone."""
    batch, size = [], 0
    for line in lines:
        line = line.rstrip(b"\r\n")
        if not line:
            continue
        if batch and (len(batch) == PUB_BATCH or size + len(line) + 1 > limit):
            yield batch
            batch, size = [], 0
        batch.append(line)
        size += len(line) + 1
    if batch:
        yield batch


@main.command()
@click.argument("topic")
@click.option("-n", "count", type=click.IntRange(min=1), default=None,
              help="exit after N messages (default: until Ctrl-C)")
@click.option("--broker", metavar="HOST:PORT",
              help="the broker to read from (default: the first live one in the registry)")
@redis_options
def tail(store, as_json, topic, count, broker):
    """Print the messages published to a topic from now on, through an ephemeral channel
    (as nsq_tail). On a topic without channels it takes the backlog, as nsq_tail does."""
    existing(store, topic)
    host, port = broker_address(store, broker)
    try:
        reader = Tail(host, port, topic)
    except (OSError, TailError) as e:
        fail(f"cannot tail {topic} on {host}:{port}: {e}")
    try:
        for msg_id, ts, attempts, body in reader.messages(count):
            if as_json:
                click.echo(json.dumps({"id": msg_id, "timestamp": ts, "attempts": attempts,
                                       "body": body.decode(errors="replace")}))
            else:
                click.echo(body)
    except KeyboardInterrupt:
        pass
    except (OSError, TailError) as e:
        fail(f"tail of {topic} stopped: {e}")
    finally:
        reader.close()


def broker_address(store: Store, broker: str | None) -> tuple[str, int]:
    if broker:
        host, _, port = broker.rpartition(":")
        if not port.isdigit():
            fail(f"invalid broker address {broker!r}: HOST:PORT")
        return host, int(port)
    live = registry.live_brokers(store.redis)
    if not live:
        fail("no live broker in the registry: start `relay broker`, or pass --broker")
    return live[0]["broadcast_address"], int(live[0]["tcp_port"])
