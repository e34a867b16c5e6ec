"""relay-admin limit: a channel's depth limit and delivery rate limit
(relay/store/limits.py), shown, set or removed. A depth that does not parse or is below 1,
an unknown overflow policy, and a rate or burst that does not parse or is out of range are
usage errors (exit 2); an unknown topic or channel is an error (exit 1); neither changes
anything."""

import click

from relay.admin.args import existing, fail, redis_options
from relay.admin.history import channel_target
from relay.admin.text import rate_text, show, table
from relay.store import Store
from relay.store.limits import (OVERFLOWS, BadRate, Limit, OldBrokers, OrderedAndLimited,
                                 parse_rate)


@click.command()
@click.argument("target", metavar="TOPIC/CHANNEL|TOPIC")
@click.argument("channel", metavar="[CHANNEL]", required=False)
@click.option("--max-depth", type=click.IntRange(min=1), metavar="N",
              help="the most messages the channel's queue holds (on a topic of P "
                   "partitions, ceil(N / P) per partition)")
@click.option("--overflow", type=click.Choice(OVERFLOWS),
              help="what a publish past it does: reject it (the default), drop the "
                   "oldest, or send the oldest to the dead-letter topic")
@click.option("--off", is_flag=True, help="remove the depth limit")
@click.option("--rate", metavar="N/s|N/m|N/h|off",
              help="the most messages a second (or minute, hour) the channel delivers, to "
                   "all its consumers on every broker together; off removes it")
@click.option("--burst", type=int, metavar="N",
              help="the most that go at once after a pause (default: a tenth of a "
                   "second's, at least 1)")
@redis_options
def limit(store, as_json, target, channel, max_depth, overflow, off, rate, burst):
    """Show a channel's depth and rate limits, or set the depth limit (--max-depth,
    --overflow) or remove it (--off), or set the delivery rate (--rate, --burst) or remove
    it (--rate off); every broker applies a depth limit to the next publish, a rate to its
    next delivery."""
    if off and (max_depth is not None or overflow is not None):
        raise click.UsageError("--off takes neither --max-depth nor --overflow")
    if overflow is not None and max_depth is None:
        raise click.UsageError("--overflow goes with --max-depth")
    if burst is not None and (rate is None or rate == "off"):
        raise click.UsageError("--burst goes with --rate")
    try:
        new_rate = None if rate is None else parse_rate(rate, burst)
    except BadRate as bad:
        raise click.UsageError(str(bad))
    topic, channel = existing(store, channel_target(target, channel), channel_required=True)
    try:
        if rate is not None and not store.limits.set_rate(topic, channel, new_rate):
            fail(f"channel {topic}/{channel} not found")
    except OldBrokers as refused:
        fail(str(refused))
    if off or max_depth is not None:
        new = None if off else Limit(max_depth, overflow or OVERFLOWS[0])
        try:
            if not store.limits.set_limit(topic, channel, new):
                fail(f"channel {topic}/{channel} not found")
        except OrderedAndLimited as refused:
            fail(str(refused))
    show_limit(store, as_json, topic, channel)


def show_limit(store: Store, as_json: bool, topic: str, channel: str) -> None:
    """The limits in force with the channel's depth and what overflowed, summed over its
    partitions."""
    data = store.limits.limit_report(topic, channel)
    if data["max_depth"] is None:
        text = f"{topic}/{channel}: no depth limit (depth {data['depth']})"
    else:
        text = table([[f"{topic}/{channel}", data["max_depth"], data["part_max_depth"],
                       data["overflow"], data["depth"], data["overflow_count"]]],
                     ["channel", "max_depth", "per_partition", "overflow", "depth",
                      "overflowed"])
    if data["rate_per_s"] is not None:
        text += (f"\n{topic}/{channel}: at most {rate_text(data['rate_per_s'])}, "
                 f"bursts of {data['rate_burst']}")
    show(data, as_json, text)

