"""relay-admin priority: show or set a topic's rule for the priority of a message
published without one (relay/store/priorities.py): for stock TCP clients, which cannot
send one."""

import click

from relay.admin.args import existing, fail, parse_target, redis_options
from relay.admin.text import show
from relay.store.priorities import PrioritiesRefused


@click.command()
@click.argument("topic")
@click.option("--json-field", metavar="FIELD",
              help="the priority of a message published without one is this field of its "
                   "JSON body: a whole number, held to 0-9 (absent or not a number: 0)")
@click.option("--off", is_flag=True, help="no rule: a message without a priority has 0")
@redis_options
def priority(store, as_json, topic, json_field, off):
    """Show or set a topic's rule for the priority (0-9, higher first) of messages
    published without one; brokers use it within a second."""
    if json_field is not None and off:
        raise click.UsageError("--json-field and --off do not go together")
    if json_field == "":
        raise click.UsageError("the field cannot be empty")
    if json_field is not None or off:
        topic, _ = parse_target(topic)
        store.control.create_topic(topic)
        try:
            store.priorities.set_rule(topic, None if off else json_field)
        except PrioritiesRefused as e:
            fail(str(e))
    else:
        topic, _ = existing(store, topic)
    field = store.priorities.rule(topic)
    show({"topic": topic, "priority_rule": field and {"kind": "json-field", "value": field}},
         as_json, f"{topic}: priority rule " + (f"json-field {field!r}" if field else "none"))
