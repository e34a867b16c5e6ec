"""What topics retain, seen everywhere: /stats (json) and /metrics of a real broker, and
relay-admin stats (table and --json, as a subprocess), on one Redis and on a cluster,
with a topic of 3 partitions retaining (sums over its parts), one retaining nothing yet
and one with retention off; and the cost of reading it (one round trip per call)."""

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from relay.store import stats
from relay.store.history import iso_ms
from relay.store.keys import id_part
from tests.helpers.admin import relay_admin
from tests.helpers.api import Api
from tests.helpers.wire import FRAME_RESPONSE, Wire

BODY = b"x" * 100
RECORD = len(BODY) + 27     # a stored record: timestamp 8, attempts 2, id 16, part 1


def admin(redis_url, *args) -> str:
    done = relay_admin(redis_url, *args)
    assert (done.returncode, done.stderr) == (0, ""), done
    return done.stdout


def published_ms(tcp_port, topic, n) -> dict:
    """part -> the ms timestamps of its messages, read and FINed off channel c."""
    wire = Wire(tcp_port)
    wire.identify()
    assert wire.sub(topic, "c", rdy=n) == (FRAME_RESPONSE, b"OK")
    by_part: dict = {}
    for _ in range(n):
        timestamp, _, msg_id, body = wire.message()
        assert body == BODY
        by_part.setdefault(id_part(msg_id), []).append(timestamp // 1_000_000)
        wire.command(f"FIN {msg_id.decode()}")
    assert wire.nothing()
    wire.close()
    return by_part


def kept(count, times, time_ms=None, max_bytes=0) -> dict:
    """The "retention" entry of count messages published at `times` (ms)."""
    settings = {} if time_ms is None else {"time_ms": time_ms, "max_bytes": max_bytes}
    return {**settings, "retained": count, "bytes": count * RECORD,
            "oldest_ms": min(times, default=None), "newest_ms": max(times, default=None)}


@pytest.mark.integration    # real processes: -m "not integration" leaves it out
@pytest.mark.cluster        # on one Redis and on a cluster (tests/conftest.py)
def test_stats_metrics_and_relay_admin_show_what_topics_retain(processes):
    url = processes.redis_url
    admin(url, "create", "kept", "--partitions", "3")
    admin(url, "create", "kept/c")
    admin(url, "retention", "kept", "--time", "1h")
    admin(url, "create", "idle")
    admin(url, "retention", "idle", "--time", "2h", "--max-bytes", "1MB")
    _, port = processes.broker()
    api = Api(port, processes.http_ports[port])
    for _ in range(3):              # each MPUB goes to the next part
        assert api.request("POST", "/mpub?topic=kept", BODY + b"\n" + BODY)[0] == 200
    assert api.request("POST", "/mpub?topic=plain", BODY + b"\n" + BODY)[0] == 200
    parts = published_ms(port, "kept", 6)
    assert sorted(len(times) for times in parts.values()) == [2, 2, 2]
    every = [ms for times in parts.values() for ms in times]
    whole = kept(6, every, 3_600_000)

    status, data = api.json("GET", "/stats?format=json")
    topics = {t["topic_name"]: t for t in data["topics"]}
    assert status == 200 and list(topics) == ["idle", "kept", "plain"]
    assert topics["kept"]["retention"] == whole
    assert topics["idle"]["retention"] == kept(0, [], 7_200_000, 1_000_000)
    assert "retention" not in topics["plain"]       # off: the entry reads as before
    assert topics["plain"]["message_count"] == 2

    status, body, _ = api.request("GET", "/metrics")
    samples = {(s.name, tuple(s.labels.values())): s.value
               for family in text_string_to_metric_families(body.decode())
               for s in family.samples if s.name.startswith("relay_topic_retained")}
    assert samples == {
        ("relay_topic_retained_messages", ("kept",)): 6,
        ("relay_topic_retained_bytes", ("kept",)): 6 * RECORD,
        ("relay_topic_retained_oldest_timestamp_seconds", ("kept",)): min(every) / 1000,
        ("relay_topic_retained_messages", ("idle",)): 0,
        ("relay_topic_retained_bytes", ("idle",)): 0}

    [_, retained, *_] = admin(url, "stats").split("\n\n")
    oldest, newest = iso_ms(min(every)), iso_ms(max(every))
    assert retained.splitlines() == [
        "topic  retention                   retained  bytes  oldest" + " " * 20 + "newest",
        "idle   time 2h, max bytes 1000000  0         0      -" + " " * 25 + "-",
        f"kept   time 1h                     6         {6 * RECORD}    {oldest}  {newest}"]
    listed = {t["topic_name"]: t for t in json.loads(admin(url, "stats", "--json",
                                                           "--partitions"))["topics"]}
    assert listed["kept"]["retention"] == whole
    assert [p["retention"] for p in listed["kept"]["parts"]] == [
        kept(2, parts[i]) for i in range(3)]
    assert "retention" not in listed["plain"]
    assert all("retention" not in p for p in listed["plain"]["parts"])


def test_stats_reads_the_histories_in_one_round_trip(store, backend):
    """Ten topics with retention cost one round trip more than the same ten without,
    whatever their number."""
    for i in range(10):
        store.publish(f"t{i}", [BODY])
        store.history.set_retention(f"t{i}", 3_600_000, 0)
        store.publish(f"t{i}", [BODY] * (i + 1))
    with_retention = round_trips(store)
    for i in range(10):
        store.history.set_retention(f"t{i}", 0, 0)
    assert round_trips(store) == with_retention - 1


def round_trips(store) -> int:
    """The commands and pipelines stats.collect sends (its result checked on the way)."""
    sent = []
    command, pipeline = store.redis.execute_command, store.redis.pipeline

    def counted_pipeline(*args, **kwargs):
        pipe = pipeline(*args, **kwargs)
        execute = pipe.execute
        pipe.execute = lambda *a, **k: sent.append("pipeline") or execute(*a, **k)
        return pipe

    store.redis.execute_command = lambda *a, **k: sent.append(a[0]) or command(*a, **k)
    store.redis.pipeline = counted_pipeline
    try:
        data = stats.collect(store)
    finally:
        del store.redis.execute_command, store.redis.pipeline
    on = [t["retention"]["retained"] for t in data["topics"] if "retention" in t]
    assert on in ([], list(range(1, 11)))
    return len(sent)
