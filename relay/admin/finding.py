"""relay-admin's commands that look at single messages without taking them: msg (where
one message is in every channel of its topic, and --delete of a waiting one) and peek
(the next queued or deferred messages of a channel, or those waiting behind their order
keys). On an ordered channel both show each message's order key. relay/store/lookup.py
reads."""

import base64
import re

import click

from relay.admin.args import existing, fail, redis_options
from relay.admin.text import show, table, utc
from relay.broker import registry
from relay.codec import go_quote
from relay.store import Store, deadletter, guarded, lookup
from relay.store.keys import PART_DIGITS, TopicKeys, id_part, id_priority

ID = re.compile(r"[0-9a-f]{16}")
STATES = {"queued": "queued", "in_flight": "in flight", "deferred": "deferred",
          "dead": "dead letter", "waiting": "waiting", "absent": "not there"}
PREVIEW = 60


@click.command()
@click.argument("topic")
@click.argument("msg_id", metavar="ID")
@click.option("--channel", help="only this channel")
@click.option("--delete", is_flag=True,
              help="take the message out of --channel: a queued one dropped, a deferred "
                   "one cancelled, one waiting behind its order key dropped (one in flight "
                   "is refused)")
@redis_options
def msg(store, as_json, topic, msg_id, channel, delete):
    """Where a message is in every channel of its topic: queued (position), in flight
    (broker, client, deadline), deferred (due time), dead letter, waiting behind its
    order key (position behind it), or not there; on ordered channels its order key."""
    existing(store, f"{topic}/{channel}" if channel else topic)
    if not ID.fullmatch(msg_id.lower()):
        fail(f"invalid message id {msg_id!r}: 16 hex digits")
    msg_id = msg_id.lower()     # ids are handed out in lower case
    if delete and not channel:
        fail("--delete needs --channel: the channel to take the message out of")
    if not published(store, topic, msg_id.encode()):
        fail(f"message {msg_id} was never published on {topic}")
    clients = {c["owner"]: c for c in registry.live_clients(
        store.redis, registry.live_brokers(store.redis))}
    places = {c: place(store, topic, c, msg_id, clients)
              for c in ([channel] if channel else store.reads.channel_names(topic))}
    if delete:
        return drop(store, as_json, topic, channel, msg_id, places[channel])
    found = next((p for p in places.values() if "body" in p), {})
    data = {"topic": topic, "id": msg_id, "timestamp": found.get("timestamp"),
            "priority": id_priority(msg_id.encode()),
            "body_base64": found.get("body") and base64.b64encode(found["body"]).decode(),
            "channels": [{"channel": c, **{k: v for k, v in p.items()
                                           if k not in ("body", "record", "id", "priority")}}
                         for c, p in places.items()]}
    show(data, as_json, msg_text(data, found.get("body")))


def published(store: Store, topic: str, msg_id: bytes) -> bool:
    """Whether the topic handed out this id: its part exists and has counted that far."""
    part = id_part(msg_id)
    if not 0 <= part < len(store.parts(topic)):
        return False
    last = guarded(store.redis.get, TopicKeys.of(store.part(topic, part)).ids)
    return 0 < int(msg_id[PART_DIGITS:], 16) <= int(last or 0)


def place(store: Store, topic: str, channel: str, msg_id: str, clients: dict) -> dict:
    """lookup.where of the message in one channel, as relay-admin shows it: the holder's
    broker and client, and a dead letter found in the dead-letter topic too (position
    None: the outbox's dead letters have theirs, in the outbox)."""
    found = lookup.where(store, topic, channel, msg_id.encode(), clients)
    if found["state"] == "absent":
        for _, _, letter in deadletter.letters(store, topic, channel):
            if letter["id"] == msg_id:
                return {"state": "dead", "position": None, "attempts": letter["attempts"],
                        "timestamp": letter["timestamp"], "body": letter["body_bytes"]}
    if found["state"] == "in_flight":
        broker, _, number = found["owner"].rpartition(":")
        found |= {"broker": broker, "connection": int(number),
                  "client": clients.get(found["owner"], {}).get("remote_address")}
    return found


def msg_text(data: dict, body: bytes | None) -> str:
    head = f"message {data['id']} of {data['topic']}"
    if data["priority"]:
        head += f", priority {data['priority']}"
    if body is not None:
        head += f", published {utc(data['timestamp'] // 1_000_000)}, body {escaped(body)}"
    keyed = any("key" in c for c in data["channels"])     # an ordered channel among them
    rows = [[c["channel"], STATES[c["state"]], c.get("attempts"), c.get("position"),
             utc(c.get("deadline_ms") or c.get("due_ms")) if "deadline_ms" in c
             or "due_ms" in c else None, c.get("broker"),
             c.get("client") or ("connection" in c and f"#{c['connection']}") or None,
             *([c.get("key")] if keyed else [])]
            for c in data["channels"]]
    if not rows:
        return head + f"\n{data['topic']} has no channels"
    return head + "\n" + table(rows, ["channel", "state", "attempts", "position", "due",
                                      "broker", "client", *["key"] * keyed])


def drop(store: Store, as_json: bool, topic: str, channel: str, msg_id: str, found: dict):
    """--delete: a queued, deferred or waiting message out of the channel, in one script
    call (a queued or deferred one of an order key lets the key's next one out)."""
    target = f"{topic}/{channel}"
    state = found["state"]
    if state == "in_flight":
        fail(f"message {msg_id} is in flight on {target} (broker {found['broker']}, client "
             f"{found['client'] or '#' + str(found['connection'])}): a consumer holds it, "
             f"not deleted")
    if state not in ("queued", "deferred", "waiting") or not lookup.remove(
            store, topic, channel, state, msg_id.encode(),
            found.get("record", b"")):
        places = "queued, deferred or waiting" if "key" in found else "queued or deferred"
        fail(f"message {msg_id} is not {places} on {target}: nothing deleted")
    where = (f"queued at position {found['position']}" if state == "queued"
             else f"waiting behind order key {found['key']} at position {found['position']}"
             if state == "waiting" else f"deferred, due {utc(found['due_ms'])}")
    show({"topic": topic, "channel": channel, "id": msg_id, "deleted": state}, as_json,
         f"deleted message {msg_id} from {target} ({where})")


@click.command()
@click.argument("topic")
@click.argument("channel")
@click.option("-n", "--limit", type=click.IntRange(min=1), default=10, show_default=True,
              help="show at most this many")
@click.option("--deferred", "show_deferred", is_flag=True,
              help="the deferred messages due first, instead of the queue")
@click.option("--waiting", "show_waiting", is_flag=True,
              help="an ordered channel's messages waiting behind their order keys, each "
                   "key's in the order they go out, instead of the queue")
@redis_options
def peek(store, as_json, topic, channel, limit, show_deferred, show_waiting):
    """The next messages of a channel's queue (or its deferred ones, with their due times,
    or those waiting behind their order keys) without taking them: a partitioned topic's
    part 0 first, each part's from its head. On an ordered channel each message's order
    key too ("-": none): a queued one is its key's message out."""
    if show_deferred and show_waiting:
        raise click.UsageError("--deferred and --waiting do not go together")
    existing(store, f"{topic}/{channel}")
    keyed = show_waiting or store.ordering.is_ordered(topic, channel)
    if show_waiting:
        rows = lookup.waiting(store, topic, channel, limit)
        columns, place_of = ["part", "position", "due"], (
            lambda m: [m["part"], m["position"], m["due_ms"] and utc(m["due_ms"])])
    elif show_deferred:
        rows = lookup.deferred(store, topic, channel, limit)
        columns, place_of = ["part", "due"], (lambda m: [m["part"], utc(m["due_ms"])])
    else:
        rows = lookup.queued(store, topic, channel, limit)
        columns, place_of = ["part", "position"], (lambda m: [m["part"], m["position"]])
    if keyed and not show_waiting:
        rows = lookup.with_keys(store, topic, channel, rows)
    ranked = any(m["priority"] for m in rows)     # a topic with priorities
    text = table([[*place_of(m), *([m["key"]] if keyed else []), m["id"],
                   *([m["priority"]] if ranked else []), m["attempts"],
                   utc(m["timestamp"] // 1_000_000), escaped(m["body"])] for m in rows],
                 [*columns, *["key"] * keyed, "id", *["priority"] * ranked, "attempts",
                  "published", "body"])
    data = [{k: v for k, v in m.items() if k != "body"}
            | {"body_base64": base64.b64encode(m["body"]).decode()} for m in rows]
    what = "waiting" if show_waiting else "deferred" if show_deferred else "queued"
    show({"topic": topic, "channel": channel, what: data}, as_json,
         text if rows else f"nothing {what} on {topic}/{channel}")


def escaped(body: bytes) -> str:
    """A body as safe text: Go-quoted (control bytes and bad UTF-8 escaped), cut short."""
    text = go_quote(body)
    return text if len(text) <= PREVIEW else text[:PREVIEW - 4] + '..."'
