"""relay-admin order and order-key: ordered delivery by key (relay/store/ordering.py).
`order` shows a channel's mode with its keys out and the messages waiting behind them,
or turns it on (making the channel) or off; `order-key` shows or sets the topic's rule
for the order key of a message published without one."""

import click

from relay.admin.args import existing, fail, parse_target, redis_options
from relay.admin.history import channel_target
from relay.admin.text import show, table
from relay.store import Store
from relay.store.limits import OrderedAndLimited
from relay.store.ordering import OrderKeyRule


@click.command()
@click.argument("target", metavar="TOPIC/CHANNEL|TOPIC")
@click.argument("channel", metavar="[CHANNEL]", required=False)
@click.option("--off", is_flag=True,
              help="deliver as any channel again: the messages waiting behind their keys "
                   "go out at once")
@click.option("--show", "only_show", is_flag=True, help="change nothing, show the mode")
@redis_options
def order(store, as_json, target, channel, off, only_show):
    """Turn ordered delivery on for a channel (making it if needed): one message of an
    order key out at a time, in publish order; different keys in parallel. --off turns
    it off, --show shows it."""
    if off and only_show:
        raise click.UsageError("--off and --show do not go together")
    named = channel_target(target, channel)
    if only_show or off:
        topic, channel = existing(store, named, channel_required=True)
    else:
        topic, channel = parse_target(named, channel_required=True)
    released = 0
    if not only_show:
        try:
            released = store.ordering.set_ordered(topic, channel, not off)
        except OrderedAndLimited as refused:
            fail(str(refused))
    show_order(store, as_json, topic, channel, released)


def show_order(store: Store, as_json: bool, topic: str, channel: str, released: int = 0
               ) -> None:
    data = store.ordering.order_report(topic, channel) | ({"released": released} if released else {})
    rule = data["order_key_rule"]
    text = table([[f"{topic}/{channel}", "on" if data["ordered"] else "off", data["keys_out"],
                   data["waiting"], f"{rule['kind']} {rule['value']}" if rule else "-"]],
                 ["channel", "ordered", "keys_out", "waiting", "order_key_rule"])
    if released:
        text += f"\n{released} messages that waited behind their keys went out"
    show(data, as_json, text)


@click.command("order-key")
@click.argument("topic")
@click.option("--json-field", metavar="FIELD",
              help="the key of a message published without one is this field of its "
                   "JSON body (a string or a number)")
@click.option("--separator", metavar="TEXT",
              help="the key of a message published without one is the text of its body "
                   "before the first TEXT")
@click.option("--off", is_flag=True, help="no rule: a message without a key has none")
@redis_options
def order_key(store, as_json, topic, json_field, separator, off):
    """Show or set a topic's rule for the order key of messages published without one
    (for NSQ clients that cannot send keys); brokers use it within a second."""
    given = [name for name, value in (("--json-field", json_field),
                                      ("--separator", separator), ("--off", off or None))
             if value is not None]
    if len(given) > 1:
        raise click.UsageError(f"{' and '.join(given)} do not go together")
    if json_field == "" or separator == "":
        raise click.UsageError("the field or separator cannot be empty")
    if given:
        topic, _ = parse_target(topic)
        store.control.create_topic(topic)
        rule = None if off else OrderKeyRule("json-field", json_field) if json_field \
            else OrderKeyRule("separator", separator)
        store.ordering.set_order_rule(topic, rule)
    else:
        topic, _ = existing(store, topic)
    rule = store.ordering.order_rule(topic)
    data = {"topic": topic, "order_key_rule": rule and {"kind": rule.kind, "value": rule.value}}
    show(data, as_json, f"{topic}: order key rule "
                        + (f"{rule.kind} {rule.value!r}" if rule else "none"))
