"""relay-admin's reading commands: topics, channels, stats (--watch), brokers, inflight
and jobs. They change nothing."""

import json
import time

import click

from relay.admin.args import existing, limit_option, redis_options
from relay.admin.text import clients_table, percent, show, stats_text, table, utc
from relay.broker import registry
from relay.store import Store
from relay.store import stats as relay_stats
from workers import operations

CLEAR = "\x1b[H\x1b[J"


@click.command()
@redis_options
def topics(store, as_json):
    """Topics, their number of channels, and whether they are paused."""
    rows = [{"topic": t["topic_name"], "channels": len(t["channels"]), "paused": t["paused"]}
            for t in relay_stats.collect(store)["topics"]]
    show({"topics": rows}, as_json,
         table([list(r.values()) for r in rows], ["topic", "channels", "paused"])
         if rows else "no topics")


@click.command()
@click.argument("topic")
@redis_options
def channels(store, as_json, topic):
    """Channels of a topic, their clients (on every broker), and whether they are paused."""
    existing(store, topic)
    [t] = stats_with_clients(store, topic, None)["topics"]
    rows = [{"channel": c["channel_name"], "clients": c["client_count"], "paused": c["paused"]}
            for c in t["channels"]]
    show({"topic": topic, "channels": rows}, as_json,
         table([list(r.values()) for r in rows], ["channel", "clients", "paused"])
         if rows else f"{topic} has no channels")


@click.command()
@click.argument("target", required=False, metavar="[TOPIC[/CHANNEL]]")
@click.option("--watch", type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="redraw every SECONDS until Ctrl-C (with --json: one line each time)")
@click.option("--partitions", "by_part", is_flag=True,
              help="each partition's figures too, under its topic and channels")
@redis_options
def stats(store, as_json, target, watch, by_part):
    """Depth, in-flight, deferred, counters, paused and clients of topics and channels
    (summed over a topic's partitions), with the clients of every live broker."""
    topic, channel = existing(store, target)
    if not watch:
        data = stats_with_clients(store, topic, channel, by_part)
        show(data, as_json, stats_text(data))
        return
    try:
        while True:
            data = stats_with_clients(store, topic, channel, by_part)
            click.echo(json.dumps(data) if as_json else CLEAR + stats_text(data))
            time.sleep(watch)
    except KeyboardInterrupt:
        pass


def stats_with_clients(store: Store, topic, channel, by_part: bool = False) -> dict:
    """relay/store/stats.py's figures, each channel with the clients live brokers announced and
    their number as client_count (rather than the channel's consumer counts, which keep
    those of a broker killed with -9), so the table counts the clients it lists."""
    data = relay_stats.collect(store, topic, channel, by_part=by_part)
    clients = registry.live_clients(store.redis, registry.live_brokers(store.redis))
    named = [(t["topic_name"], c["channel_name"]) for t in data["topics"] for c in t["channels"]]
    urgent = iter(store.reads.urgent_depths(named))
    for t in data["topics"]:
        for c in t["channels"]:
            above = next(urgent)
            c["depth_by_priority"] = {**{str(p): n for p, n in above.items()},
                                      "0": c["depth"] - sum(above.values())}
            c["clients"] = [client for client in clients
                            if (client["topic"], client["channel"]) ==
                            (t["topic_name"], c["channel_name"])]
            c["client_count"] = len(c["clients"])
    return data


@click.command()
@redis_options
def brokers(store, as_json):
    """Live brokers (from the registry) and the clients each has subscribed."""
    live = registry.live_brokers(store.redis)
    clients = registry.live_clients(store.redis, live)
    data = [{**b, "clients": [c for c in clients if c["broker"] == b["id"]]} for b in live]
    rows = [[b["id"], b["remote_address"], b["http_port"], b["version"], len(b["clients"])]
            for b in data]
    text = table(rows, ["broker", "address", "http_port", "version", "clients"])
    if clients:
        text += "\n\n" + clients_table(clients)
    show({"brokers": data}, as_json, text if live else "no live brokers")


@click.command()
@click.argument("target", metavar="TOPIC/CHANNEL")
@limit_option("show the messages due first, at most this many")
@redis_options
def inflight(store, as_json, target, limit):
    """Messages in flight: id, attempts, deadline, owner broker and client; on an ordered
    channel, each one's order key too ("-": none)."""
    topic, channel = existing(store, target, channel_required=True)
    state = store.reads.read_channel(topic, channel)
    total, ordered = state["in_flight_count"], state["ordered"]
    clients = {c["owner"]: c for c in registry.live_clients(
        store.redis, registry.live_brokers(store.redis))}
    rows = []
    for m in relay_stats.in_flight(store, topic, channel, limit):
        broker, _, number = m["owner"].rpartition(":")
        client = clients.get(m["owner"], {})
        rows.append({"id": m["id"], "attempts": m["attempts"], "deadline": m["deadline_ms"],
                     "broker": broker, "connection": int(number),
                     "client": client.get("remote_address"),
                     **({"key": m["key"]} if ordered else {})})
    text = table([[r["id"], r["attempts"], utc(r["deadline"]), r["broker"],
                   r["client"] or f"#{r['connection']}", *([r["key"]] if ordered else [])]
                  for r in rows],
                 ["id", "attempts", "deadline", "broker", "client", *["key"] * ordered])
    if total > len(rows):
        text += f"\n({len(rows)} of {total} shown, those due first)"
    show({"in_flight_count": total, "messages": rows}, as_json,
         text if rows else f"nothing in flight on {target}")


@click.command("jobs")
@redis_options
def list_jobs(store, as_json):
    """rq jobs of relay-admin (queue "relay"), oldest first, with state and progress."""
    rows = []
    for job in operations.all_jobs(store.redis):
        progress = job.meta.get("progress", {})
        rows.append({"job": job.id, "operation": job.meta.get("operation"),
                     "target": job.meta.get("target"),
                     "state": job.get_status(refresh=False).value,
                     "done": progress.get("done"), "total": progress.get("total"),
                     "enqueued_at": job.enqueued_at and job.enqueued_at.isoformat(),
                     "ended_at": job.ended_at and job.ended_at.isoformat()})
    show({"jobs": rows}, as_json,
         table([[r["job"], r["operation"], r["target"], r["state"], percent(r)]
                for r in rows], ["job", "operation", "target", "state", "progress"])
         if rows else "no jobs")
