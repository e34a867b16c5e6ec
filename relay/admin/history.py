"""relay-admin's commands on topics' histories (relay/store/history.py): retention (show
or set what a topic keeps) and replay (rewind a channel); `create --from earliest` is in
steering.py. Durations, sizes and times are parsed as click parameters, so a bad one is
a usage error (exit 2); a range the topic retains nothing of is an error (exit 1)."""

import click

from relay.admin.args import background_option, existing, fail, redis_options
from relay.admin.steering import run_operation
from relay.admin.text import retention_text, show, table, utc
from relay.codec import MSG_ID_LENGTH
from relay.options import parse_duration, parse_size, parse_time
from relay.store import Store
from relay.store.history import ReplayRefused


class Parsed(click.ParamType):
    """A parameter read by `parse` (which raises ValueError on a bad value)."""

    def __init__(self, name: str, parse):
        self.name = name
        self.parse = parse

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return self.parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


DURATION = Parsed("duration", parse_duration)
SIZE = Parsed("size", parse_size)
TIME = Parsed("time", parse_time)


@click.command()
@click.argument("topic")
@click.option("--time", "time_ms", type=DURATION, metavar="DURATION",
              help="keep every message this long, e.g. 24h, 7d (0: no time limit)")
@click.option("--max-bytes", type=SIZE, metavar="SIZE",
              help="and at most this many bytes of records per partition, e.g. 1GB")
@click.option("--off", is_flag=True, help="keep nothing more, and drop the history")
@redis_options
def retention(store, as_json, topic, time_ms, max_bytes, off):
    """Show what a topic retains for replay, or set it: --time, --max-bytes, --off."""
    if off and (time_ms is not None or max_bytes is not None):
        raise click.UsageError("--off takes neither --time nor --max-bytes")
    if not off and (time_ms, max_bytes) in ((0, None), (None, 0), (0, 0)):
        raise click.UsageError("that keeps nothing: give --off to turn retention off")
    topic, _ = existing(store, topic)
    if off:
        store.history.set_retention(topic, 0, 0)
    elif time_ms is not None or max_bytes is not None:
        store.history.set_retention(topic, time_ms or 0, max_bytes or 0)
    show_retention(store, as_json, topic)


def show_retention(store: Store, as_json: bool, topic: str) -> None:
    data = store.history.retention_report(topic)
    rows = data["partitions"]
    setting = retention_text(data["time_ms"], data["max_bytes"])
    show(data, as_json, f"{topic}: retention {setting}\n" + table(
        [[r["partition"], r["retained"], r["bytes"], r["oldest"], r["newest"]] for r in rows],
        ["partition", "retained", "bytes", "oldest", "newest"]))


def channel_target(target: str, channel: str | None) -> str:
    """TOPIC/CHANNEL, given so or as TOPIC CHANNEL."""
    if channel is None:
        return target
    if "/" in target:
        raise click.UsageError("give TOPIC/CHANNEL or TOPIC CHANNEL, not both")
    return f"{target}/{channel}"


@click.command()
@click.argument("target", metavar="TOPIC/CHANNEL|TOPIC")
@click.argument("channel", metavar="[CHANNEL]", required=False)
@click.option("--since", type=DURATION, metavar="DURATION",
              help="the messages published this long ago or later, e.g. 2h")
@click.option("--from-time", type=TIME, metavar="TIME",
              help="the messages published at this time (ISO 8601) or later")
@click.option("--from-id", metavar="ID",
              help="this message and those published after it")
@click.option("--to-time", type=TIME, metavar="TIME",
              help="up to this time (ISO 8601), else up to the newest")
@background_option
@redis_options
def replay(store, as_json, target, channel, since, from_time, from_id, to_time, background):
    """Put a topic's retained messages back in a channel's queue, in publish order, with
    their ids, timestamps and bodies (attempts start over); messages of the channel in
    flight or deferred are left alone. Big ones run as rq jobs."""
    if sum(x is not None for x in (since, from_time, from_id)) != 1:
        raise click.UsageError("give one of --since, --from-time and --from-id")
    if from_id is not None and (len(from_id) != MSG_ID_LENGTH
                                or from_id.strip("0123456789abcdef")):
        raise click.UsageError(f"invalid message id {from_id!r}: 16 hex digits")
    if from_time is not None and to_time is not None and to_time < from_time:
        raise click.UsageError("--to-time is before --from-time")
    topic, channel = existing(store, channel_target(target, channel), channel_required=True)
    from_ms = store.now_ms() - since if since is not None else from_time
    try:
        plan = store.history.plan_replay(topic, from_ms, to_time, from_id)
    except ReplayRefused as refused:
        fail(str(refused))
    if plan.clipped:
        click.echo(f"relay-admin: topic {topic} retains messages from "
                   f"{utc(plan.oldest_ms)} on: replaying from there", err=True)
    run_operation(store, as_json, "replay", topic, channel, background, plan.size, plan.params)
