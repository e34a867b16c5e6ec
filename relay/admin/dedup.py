"""relay-admin dedup: show or set a topic's dedup window (relay/store/dedup.py), within
which a publish key already published publishes nothing again."""

import click

from relay.admin.args import existing, parse_target, redis_options
from relay.admin.history import DURATION
from relay.admin.text import duration_text, show, table


@click.command()
@click.argument("topic")
@click.option("--window", "window_ms", type=DURATION, metavar="DURATION",
              help="remember each publish key this long, e.g. 10m (creates the topic)")
@click.option("--off", is_flag=True, help="remember no keys: publishes with keys publish "
                                          "everything, as nsqd")
@redis_options
def dedup(store, as_json, topic, window_ms, off):
    """Show a topic's dedup window and the keys each partition remembers, or set it:
    --window, --off."""
    if off and window_ms is not None:
        raise click.UsageError("--off takes no --window")
    if window_ms == 0:
        raise click.UsageError("a window of 0 remembers nothing: give --off to turn it off")
    if window_ms is not None:
        topic, _ = parse_target(topic)
        store.control.create_topic(topic)
        store.dedup.set_dedup(topic, window_ms)
    else:
        topic, _ = existing(store, topic)
        if off:
            store.dedup.set_dedup(topic, 0)
    data = store.dedup.dedup_report(topic)
    setting = f"window {duration_text(data['window_ms'])}" if data["on"] else "off"
    show(data, as_json, f"{topic}: dedup {setting}\n" + table(
        [[p["partition"], p["keys"]] for p in data["partitions"]], ["partition", "keys"]))
