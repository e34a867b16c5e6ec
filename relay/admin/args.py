"""relay-admin's command line apart from its commands: the options every command takes,
usage errors in one line, TOPIC[/CHANNEL] names, relay's options as relay-admin reads
them, and fail()."""

import contextlib
import functools
import sys
from typing import NoReturn

import click
import redis

from relay.codec import is_valid_name
from relay.errors import ConfigError, StoreConnectionError, StoreError
from relay.options import Options, config_file, load_options, redacted_url
from relay.store import Store, layout, replication
from relay.store.causes import cause
from relay.store.connection import connect
from workers import operations

NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())     # click 8.2+: no command
REDIS_ENV = ["RELAY_REDIS_URL", "REDIS_URL"]
TIMEOUT = 5  # seconds relay-admin waits for Redis


def redis_options(command=None, *, any_layout: bool = False):
    """--redis-url (else relay-admin's) and --json, shared by every command. A command
    refuses a Redis whose data layout this release cannot read, unless `any_layout`."""
    if command is None:
        return functools.partial(redis_options, any_layout=any_layout)

    @click.option("--redis-url", metavar="URL",
                  help=f"Redis holding relay's state; default: the one given before the "
                       f"command, else {', else '.join(REDIS_ENV)}, else {Options.redis_url}")
    @click.option("--json", "as_json", is_flag=True, help="machine-readable output")
    @functools.wraps(command)
    def wrapper(redis_url, as_json, **kwargs):
        redis_url = redis_url or click.get_current_context().find_root().params["redis_url"]
        try:
            store = Store(connect(redis_url, timeout=TIMEOUT, connect_timeout=2))
            if not any_layout:
                layout.check(store.redis)
            return command(store, as_json, **kwargs)
        except ConfigError as e:     # a layout it cannot read, a server too old
            fail(str(e))
        except (StoreConnectionError, redis.exceptions.ConnectionError,
                redis.exceptions.TimeoutError) as e:
            fail(f"redis at {redacted_url(redis_url)} is unreachable: {e}")
        except (StoreError, operations.NotFound) as e:
            fail(str(e))
        except redis.exceptions.ResponseError as e:     # refused (causes.py), e.g. by rq
            fail(cause(e))
    return wrapper


def background_option(command):
    return click.option("--background", is_flag=True,
                        help="queue the job and return at once")(command)


def limit_option(help: str):
    """-n/--limit: how many rows a listing shows at most."""
    return click.option("-n", "--limit", type=click.IntRange(min=1), default=100,
                        show_default=True, help=help)


def fail(message: str) -> NoReturn:
    click.echo(f"relay-admin: {message}", err=True)
    sys.exit(1)


def parse_target(target: str | None, channel_required: bool = False):
    """TOPIC or TOPIC/CHANNEL, validated as nsqd names."""
    if not target:
        return None, None
    topic, _, channel = target.partition("/")
    if channel_required and not channel:
        fail(f"{target!r} names no channel: give TOPIC/CHANNEL")
    for name in (topic, channel) if channel else (topic,):
        if not is_valid_name(name):
            fail(f"invalid name {name!r}: 1-64 characters of [.a-zA-Z0-9_-], "
                 "optionally ending in #ephemeral")
    return topic, channel or None


def existing(store: Store, target: str | None, channel_required: bool = False):
    """parse_target, and fail unless the topic (and channel) exist."""
    topic, channel = parse_target(target, channel_required)
    if topic and topic not in store.reads.topic_names():
        fail(f"topic {topic!r} not found")
    if channel and channel not in store.reads.channel_names(topic):
        fail(f"channel {topic}/{channel} not found")
    return topic, channel


class OneLineUsageError(click.ClickException):
    """A usage error told in one line, as every error of relay-admin (exit 2)."""
    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"relay-admin: {self.format_message()}", err=True)


@contextlib.contextmanager
def one_line_usage():
    try:
        yield
    except NO_ARGS:
        raise           # `relay-admin` alone: its help
    except click.UsageError as e:
        where = " ".join(["relay-admin", *(e.ctx.command_path.split()[1:] if e.ctx else [])])
        raise OneLineUsageError(f"{e.format_message().rstrip('.')} (see {where} --help)") from None


class AdminGroup(click.Group):
    """Parses the command line (its own, then the command's) with one_line_usage."""

    def make_context(self, *args, **kwargs):
        with one_line_usage():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with one_line_usage():
            return super().invoke(ctx)


def replicated(store: Store) -> Store:
    """A store on the same client whose publishes wait for --wait-replicas replicas, as
    relay's options say (relay_options)."""
    options, _ = relay_options()
    return Store(store.redis, **replication(options, TIMEOUT * 1000))


def relay_options() -> tuple[Options, str | None]:
    """relay's options as relay-admin reads them (--config, RELAY_CONFIG or conf/relay.toml,
    and RELAY_<NAME> variables), with the config file read."""
    config = config_file(click.get_current_context().find_root().params["config"])
    try:
        return load_options(config=config), config
    except ConfigError as e:
        fail(str(e))
