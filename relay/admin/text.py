"""What relay-admin prints: aligned text tables, UTC times, and the text of each
command's result (every command also takes --json)."""

import json

import click

from relay.store.history import iso_ms

STATS_COLUMNS = ["topic", "channel", "depth", "in_flight", "deferred", "messages",
                 "requeued", "timed_out", "dead", "deleted", "expired", "overflowed", "clients",
                 "paused"]
ORDER_COLUMNS = ["ordered", "keys_out", "waiting"]     # when some channel is ordered
RATE_COLUMNS = ["rate"]         # when some channel has a rate limit
PRIORITY_COLUMNS = ["by_priority"]  # when some channel has messages of priority above 0
RETAINED_COLUMNS = ["topic", "retention", "retained", "bytes", "oldest", "newest"]
CLIENT_COLUMNS = ["broker", "channel", "client", "address", "user_agent", "ready",
                  "in_flight", "messages", "finished", "requeued", "connected"]


def table(rows: list[list], headers: list[str]) -> str:
    """A plain aligned text table."""
    cells = [headers] + [[cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "-" if value is None else str(value)


def show(data, as_json: bool, text: str) -> None:
    click.echo(json.dumps(data, indent=2) if as_json else text)


utc = iso_ms    # a Redis ms timestamp as UTC ISO 8601


def stats_text(data: dict) -> str:
    """The stats table; read --partitions, each part's row names its master. With an
    ordered channel among them, each channel's mode, keys with a message out and messages
    waiting behind them too (ORDER_COLUMNS); with a rate-limited channel, each channel's
    rate limit (RATE_COLUMNS); with messages above priority 0, each channel's depth by
    priority (PRIORITY_COLUMNS)."""
    rows, clients = [], []
    by_part = any("parts" in t for t in data["topics"])
    ordered = any(c.get("ordered") for t in data["topics"] for c in t["channels"])
    limited = any(c.get("rate_limit") for t in data["topics"] for c in t["channels"])
    ranked = any(len(c.get("depth_by_priority", {})) > 1
                 for t in data["topics"] for c in t["channels"])
    for t in data["topics"]:
        for label, row in [(t["topic_name"], t)] + _part_rows(t):
            rows.append([label, "", row["depth"], "", row["deferred_count"],
                         row["message_count"], *[""] * 7, row["paused"],
                         *[""] * (len(ORDER_COLUMNS) * ordered + limited + ranked),
                         *([row.get("master", "")] if by_part else [])])
        for c in t["channels"]:
            for label, row in [(c["channel_name"], c)] + _part_rows(c):
                rows.append(["", label, row["depth"], row["in_flight_count"],
                             row["deferred_count"], row["message_count"],
                             row["requeue_count"], row["timeout_count"], row["dead_count"],
                             row["deleted_count"], row["expired_count"], row["overflow_count"],
                             row.get("client_count", ""), row["paused"],
                             *([row["ordered"], row["order_keys_out"], row["order_waiting"]]
                               if ordered else []),
                             *([rate_text(c["rate_limit"]) if c["rate_limit"] else ""]
                               if limited else []),
                             *([priority_text(c["depth_by_priority"]) if row is c else ""]
                               if ranked else []),
                             *([row.get("master", "")] if by_part else [])])
            clients += c["clients"]
    if not rows:
        return "no topics"
    text = table(rows, STATS_COLUMNS + ORDER_COLUMNS * ordered + RATE_COLUMNS * limited
                 + PRIORITY_COLUMNS * ranked + ["master"] * by_part)
    if any("retention" in t for t in data["topics"]):
        text += "\n\n" + retained_table(data["topics"])
    return text + "\n\n" + clients_table(clients) if clients else text


def priority_text(depths: dict) -> str:
    """A channel's depth by priority, highest first: "9:3 5:2 0:10"."""
    return " ".join(f"{p}:{n}" for p, n in depths.items() if n)


def rate_text(per_s: float) -> str:
    """A rate as a person reads it: 200/s, 1.5/s, 30/m."""
    if per_s < 1 and (per_s * 60) % 1 == 0:
        return f"{per_s * 60:g}/m"
    return f"{per_s:g}/s"


def retained_table(topics: list[dict]) -> str:
    """What the topics with retention on retain (each partition's too, if read)."""
    rows = []
    for t in topics:
        if "retention" not in t:
            continue
        kept = t["retention"]
        rows.append([t["topic_name"], retention_text(kept["time_ms"], kept["max_bytes"]),
                     *_retained_cells(kept)])
        rows += [[label, "", *_retained_cells(part["retention"])]
                 for label, part in _part_rows(t)]
    return table(rows, RETAINED_COLUMNS)


def _retained_cells(kept: dict) -> list:
    return [kept["retained"], kept["bytes"], kept["oldest_ms"] and utc(kept["oldest_ms"]),
            kept["newest_ms"] and utc(kept["newest_ms"])]


def retention_text(time_ms: int, max_bytes: int) -> str:
    """A retention setting as a person reads it: "time 24h, max bytes 1000000000", "off"."""
    return ", ".join(text for text in (time_ms and f"time {duration_text(time_ms)}",
                                       max_bytes and f"max bytes {max_bytes}") if text) or "off"


def duration_text(ms: int) -> str:
    """ms as the largest whole unit: 86400000 -> 24h."""
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _part_rows(entry: dict) -> list[tuple[str, dict]]:
    """(label, figures) of each partition, when stats were read --partitions."""
    return [(f"  partition {i}", part) for i, part in enumerate(entry.get("parts", []))]


def clients_table(clients: list[dict]) -> str:
    rows = [[c["broker"], f"{c['topic']}/{c['channel']}", c["client_id"],
             c["remote_address"], c["user_agent"], c["ready_count"], c["in_flight_count"],
             c["message_count"], c["finish_count"], c["requeue_count"],
             utc(c["connect_ts"] * 1000)] for c in clients]
    return table(rows, CLIENT_COLUMNS)


def percent(row: dict) -> str:
    if row["total"] is None:
        return "-"
    done = 100 if not row["total"] else 100 * row["done"] // row["total"]
    return f"{done}% ({row['done']}/{row['total']})"


def summary(result: dict) -> str:
    target = result["target"]
    if result["operation"] == "requeue":
        return f"requeued {result['requeued']} messages in flight on {target}"
    if result["operation"] == "redrive":
        return f"redrove {result['requeued']} dead letters to {target}"
    if result["operation"] == "replay":
        return (f"replayed {result['replayed']} messages to {target} ({result['skipped']} "
                f"skipped: in flight or deferred)")
    verb = "emptied" if result["operation"] == "empty" else "deleted"
    return f"{verb} {target}: {result['messages']} messages dropped (ids up to {result['cut_id']})"


def preview(body: str, width: int = 60) -> str:
    body = body.replace("\n", "\\n")
    return body if len(body) <= width else body[:width - 3] + "..."
