"""relay-admin limit: a channel's depth limit (relay/store/limits.py), shown, set or
removed. A depth that does not parse or is below 1 and an unknown overflow policy are
usage errors (exit 2); an unknown topic or channel is an error (exit 1); neither
changes anything."""

import click

from relay.admin.args import existing, fail, redis_options
from relay.admin.history import channel_target
from relay.admin.text import show, table
from relay.store import Store
from relay.store.limits import OVERFLOWS, Limit, OrderedAndLimited


@click.command()
@click.argument("target", metavar="TOPIC/CHANNEL|TOPIC")
@click.argument("channel", metavar="[CHANNEL]", required=False)
@click.option("--max-depth", type=click.IntRange(min=1), metavar="N",
              help="the most messages the channel's queue holds (on a topic of P "
                   "partitions, ceil(N / P) per partition)")
@click.option("--overflow", type=click.Choice(OVERFLOWS),
              help="what a publish past it does: reject it (the default), drop the "
                   "oldest, or send the oldest to the dead-letter topic")
@click.option("--off", is_flag=True, help="remove the limit")
@redis_options
def limit(store, as_json, target, channel, max_depth, overflow, off):
    """Show a channel's depth limit, or set it (--max-depth, --overflow) or remove it
    (--off); every broker applies it to the next publish."""
    if off and (max_depth is not None or overflow is not None):
        raise click.UsageError("--off takes neither --max-depth nor --overflow")
    if overflow is not None and max_depth is None:
        raise click.UsageError("--overflow goes with --max-depth")
    topic, channel = existing(store, channel_target(target, channel), channel_required=True)
    if off or max_depth is not None:
        new = None if off else Limit(max_depth, overflow or OVERFLOWS[0])
        try:
            if not store.limits.set_limit(topic, channel, new):
                fail(f"channel {topic}/{channel} not found")
        except OrderedAndLimited as refused:
            fail(str(refused))
    show_limit(store, as_json, topic, channel)


def show_limit(store: Store, as_json: bool, topic: str, channel: str) -> None:
    """The limit in force with the channel's depth and what overflowed, summed over its
    partitions."""
    data = store.limits.limit_report(topic, channel)
    if data["max_depth"] is None:
        text = f"{topic}/{channel}: no depth limit (depth {data['depth']})"
    else:
        text = table([[f"{topic}/{channel}", data["max_depth"], data["part_max_depth"],
                       data["overflow"], data["depth"], data["overflow_count"]]],
                     ["channel", "max_depth", "per_partition", "overflow", "depth",
                      "overflowed"])
    show(data, as_json, text)
