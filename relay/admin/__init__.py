"""`relay-admin`: inspect and steer relay's state straight in Redis.

Every command prints an aligned table (or one line) and takes --json; it exits 0 on
success, 1 with one line on stderr on an error and 2 with one line on a usage error.
The commands live by what they do: reading.py (topics, channels, stats, brokers,
inflight, jobs), steering.py (create, pause, unpause, empty, delete, requeue, config),
messages.py (dlq, redrive, pub, tail), history.py (retention, replay), finding.py (msg,
peek), expiry.py (ttl), dedup.py (dedup), limits.py (limit), ordering.py (order,
order-key), priority.py (priority) and upgrade.py (upgrade status, finish); args.py holds the options they
share and text.py what they print.
"""

import click

from relay.admin import (dedup, expiry, finding, history, limits, messages, ordering, priority,
                         reading, steering, upgrade)
from relay.admin.args import REDIS_ENV, AdminGroup
from relay.options import DEFAULT_CONFIG, Options


@click.group(cls=AdminGroup)
@click.option("--redis-url", envvar=REDIS_ENV, default=Options.redis_url, show_default=True,
              show_envvar=True, metavar="URL", help="Redis holding relay's state")
@click.option("--config", type=click.Path(dir_okay=False),
              help=f"relay's TOML config file, for the options pub and config read "
                   f"(default: RELAY_CONFIG, else {DEFAULT_CONFIG} if present)")
def main(redis_url, config):
    """Inspect and steer relay (topics, channels and messages in Redis)."""


for module in (reading, steering, messages, history, finding, expiry, dedup, limits, ordering,
               priority):
    for command in vars(module).values():
        if isinstance(command, click.Command):
            main.add_command(command)
main.add_command(upgrade.upgrade)     # a group: its commands are under `upgrade`
