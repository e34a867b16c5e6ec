"""relay-admin ttl: show or set how old a message may be when it is delivered (the
Store's set_ttl and ttl.lua keep it; deliver.lua applies it, and the scanners' sweep
takes expired messages nobody consumes out: relay/store/expiry.py). A TTL that does
not parse or is negative is a usage error (exit 2), an unknown topic or channel an
error (exit 1), and neither changes anything."""

import click

from relay.admin.args import existing, fail, redis_options
from relay.admin.text import duration_text, show, table
from relay.options import parse_duration
from relay.store import Store


@click.command()
@click.argument("target", metavar="TOPIC[/CHANNEL]")
@click.argument("words", nargs=-1, metavar="[CHANNEL] [TTL]")
@click.option("--off", is_flag=True,
              help="clear the setting: a channel takes its topic's TTL again")
@redis_options
def ttl(store, as_json, target, words, off):
    """Show the message TTLs in force on a topic's channels, or set one, e.g. 10m, 1h: a
    message older than that (from its publish time) when it would be delivered goes to
    the channel's dead-letter topic with reason expired if it has one, else it is
    dropped. A topic's TTL governs its channels, later ones too, but for a channel's own
    (0: none, whatever the topic's). A second word that starts with a digit is a TTL:
    name such a channel TOPIC/CHANNEL."""
    named, ttl_ms = split_words(target, words)
    if off and ttl_ms is not None:
        raise click.UsageError("give a TTL or --off, not both")
    topic, channel = existing(store, named)
    if (off or ttl_ms is not None) and not store.expiry.set_ttl(topic, channel, ttl_ms):
        fail(f"channel {topic}/{channel} not found")
    show_ttl(store, as_json, topic, channel)


def split_words(target: str, words: tuple) -> tuple[str, int | None]:
    """TOPIC[/CHANNEL] and the TTL in ms (None: none given) of the command's words."""
    if "/" not in target and words and not is_ttl_word(words[0]):
        target, words = f"{target}/{words[0]}", words[1:]
    if len(words) > 1:
        raise click.UsageError(f"unexpected extra argument {words[1]!r}")
    return target, parse_ttl(words[0]) if words else None


def is_ttl_word(word: str) -> bool:
    return word[:1].isdigit() or word[:1] in "-+."


def parse_ttl(word: str) -> int:
    try:
        ms = parse_duration(word)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'TTL'") from None
    if ms < 0:
        raise click.BadParameter(f"a TTL is not negative: {word!r}", param_hint="'TTL'")
    return ms


def show_ttl(store: Store, as_json: bool, topic: str, channel: str | None) -> None:
    settings = store.expiry.ttl_settings(topic)
    rows = [{"channel": name, **setting} for name, setting in settings["channels"].items()
            if channel in (None, name)]
    head = f"{topic}: ttl {ttl_text(settings['ttl_ms'])}"
    show({"topic": topic, "ttl_ms": settings["ttl_ms"], "channels": rows}, as_json,
         head + "\n" + table([[r["channel"], ttl_text(r["ttl_ms"]), r["source"]]
                              for r in rows], ["channel", "ttl", "set on"])
         if rows else f"{head}; no channels")


def ttl_text(ms: int | None) -> str:
    """A TTL as a person reads it: 10m; "off" for none."""
    return duration_text(ms) if ms else "off"
