"""relay-admin's commands on messages themselves: dlq and redrive (dead letters), pub
(stdin as messages) and tail (a topic's messages from now on, through a live broker)."""

import json
import sys
import tempfile

import click

from relay.admin.args import (background_option, existing, fail, limit_option, parse_target,
                              redis_options, relay_options, replicated)
from relay.admin.steering import run_operation
from relay.admin.tail import Tail, TailError
from relay.admin.text import preview, show, table, utc
from relay.broker import registry
from relay.store import Store, deadletter
from relay.store.dedup import MAX_KEY_BYTES, key_problem
from relay.store.ordering import order_key_problem
from relay.store.priorities import PrioritiesRefused

PUB_BATCH = 1000
PUB_BATCH_BYTES = 1 << 20
PUB_SPOOL_BYTES = 64 << 20      # pub's input is kept in memory up to this, then on disk
PUB_KEY_BYTES = MAX_KEY_BYTES - 17      # --id's, so that KEY:N fits (N: up to 16 digits)


@click.command()
@click.argument("target", metavar="TOPIC/CHANNEL")
@limit_option("show at most this many")
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


@click.command()
@click.argument("target", metavar="TOPIC/CHANNEL")
@background_option
@redis_options
def redrive(store, as_json, target, background):
    """Queue a channel's dead letters on it again (attempts start over) and remove them
    from the dead-letter topic."""
    topic, channel = existing(store, target, channel_required=True)
    size = sum(1 for _ in deadletter.letters(store, topic, channel))
    run_operation(replicated(store), as_json, "redrive", topic, channel, background, size)


@click.command()
@click.argument("topic")
@click.option("--file", "source", type=click.File("rb"), default="-",
              help="read the messages from this file instead of stdin")
@click.option("--id", "key", metavar="KEY",
              help="publish message N (of the non-empty lines) with the key KEY:N: run "
                   "again, it publishes nothing the topic's dedup window remembers")
@click.option("--key", "order_key", metavar="ORDER_KEY",
              help="publish every message with this order key: an ordered channel "
                   "delivers them one at a time, in order (relay-admin order)")
@click.option("--priority", type=click.IntRange(0, 9), metavar="N",
              help="publish every message at priority N (0-9, higher first; data layout 5)")
@redis_options
def pub(store, as_json, topic, source, key, order_key, priority):
    """Publish each non-empty line of stdin (or --file) as a message, in batches of at
    most --max-body-size; a line over --max-msg-size is refused and, as nsqd's /mpub,
    nothing is published."""
    parse_target(topic)
    if key is not None:
        problem = key_problem(key.encode()) or (
            len(key.encode()) > PUB_KEY_BYTES and "ID_TOO_LONG")
        if problem:
            raise click.UsageError(f"--id {key!r}: {problem}: 1-{PUB_KEY_BYTES} bytes of text "
                                   f"without spaces")
    order_problem = order_key_problem(order_key.encode()) if order_key is not None else None
    if order_problem:
        raise click.UsageError(f"--key {order_key!r}: {order_problem}: 1-256 bytes of text "
                               "without spaces")
    if priority:
        try:
            store.priorities.check_layout()
        except PrioritiesRefused as e:
            fail(str(e))
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
        count = duplicates = 0
        for batch in batches(lines, min(PUB_BATCH_BYTES, options.max_body_size)):
            order_keys = store.ordering.order_keys(
                topic, batch, None if order_key is None else [order_key.encode()] * len(batch))
            ranks = store.priorities.of(topic, batch, priority)
            if key is None and order_keys is None and ranks is None:
                store.publish(topic, batch)
            else:
                numbers = range(count + 1, count + len(batch) + 1)
                duplicates += store.dedup.publish_keyed(
                    topic, batch, key and [f"{key}:{n}".encode() for n in numbers], 0,
                    order_keys, ranks)
            count += len(batch)
    if key is None:
        show({"topic": topic, "published": count}, as_json,
             f"published {count} messages to {topic}")
        return
    show({"topic": topic, "published": count - duplicates, "duplicates": duplicates}, as_json,
         f"published {count - duplicates} messages to {topic}, {duplicates} duplicates "
         f"not published again")
    if not store.dedup.dedup_window(topic):
        click.echo(f"relay-admin: topic {topic} has no dedup window, so --id changes nothing "
                   f"(relay-admin dedup {topic} --window 10m turns it on)", err=True)


def batches(lines, limit: int):
    """Non-empty lines without their line end, PUB_BATCH at a time and at most `limit`
    bytes as /mpub's body (a newline each), or one line alone."""
    batch: list[bytes] = []
    size = 0
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


@click.command()
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
