"""`relay-admin`: inspect and steer relay's state straight in Redis."""

import functools
import json
import sys

import click
import redis

from relay import stats as relay_stats
from relay.errors import StoreError
from relay.protocol.codec import is_valid_name
from relay.store import Store

STATS_COLUMNS = ["topic", "channel", "depth", "in_flight", "deferred", "messages",
                 "requeued", "timed_out", "clients"]


def redis_options(command):
    """--redis-url (REDIS_URL / RELAY_REDIS_URL) and --json, shared by every command."""
    @click.option("--redis-url", envvar=["RELAY_REDIS_URL", "REDIS_URL"],
                  default="redis://127.0.0.1:6379/0", show_default=True)
    @click.option("--json", "as_json", is_flag=True, help="machine-readable output")
    @functools.wraps(command)
    def wrapper(redis_url, as_json, **kwargs):
        store = Store(redis.Redis.from_url(redis_url, socket_connect_timeout=2,
                                           socket_timeout=5))
        try:
            return command(store, as_json, **kwargs)
        except StoreError as e:
            fail(f"redis at {redis_url} is unreachable: {e}")
    return wrapper


def fail(message: str):
    click.echo(f"relay-admin: {message}", err=True)
    sys.exit(1)


def table(rows: list[list], headers: list[str]) -> str:
    """A plain aligned text table."""
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def parse_target(target: str | None):
    """TOPIC or TOPIC/CHANNEL, validated as nsqd names."""
    if not target:
        return None, None
    topic, _, channel = target.partition("/")
    for name in filter(None, (topic, channel)):
        if not is_valid_name(name):
            fail(f"invalid name {name!r}: 1-64 characters of [.a-zA-Z0-9_-], "
                 "optionally ending in #ephemeral")
    return topic, channel or None


@click.group()
def main():
    """Inspect and steer relay (topics, channels and messages in Redis)."""


@main.command()
@click.argument("target", required=False, metavar="[TOPIC[/CHANNEL]]")
@redis_options
def stats(store, as_json, target):
    """Depth, in-flight, deferred and counters of topics and channels."""
    topic, channel = parse_target(target)
    if topic and topic not in store.topic_names():
        fail(f"topic {topic!r} not found")
    if channel and channel not in store.channel_names(topic):
        fail(f"channel {topic}/{channel} not found")
    data = relay_stats.collect(store, topic, channel)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    rows = []
    for t in data["topics"]:
        rows.append([t["topic_name"], "", t["depth"], "", t["deferred_count"],
                     t["message_count"], "", "", ""])
        for c in t["channels"]:
            rows.append(["", c["channel_name"], c["depth"], c["in_flight_count"],
                         c["deferred_count"], c["message_count"], c["requeue_count"],
                         c["timeout_count"], c["client_count"]])
    click.echo(table(rows, STATS_COLUMNS) if rows else "no topics")
