"""What a user runs for replay: relay-admin retention, replay and create --from earliest
through its command line (click's runner, on fakeredis, a real Redis and a cluster), and
the HTTP extensions against a real broker with real NSQ consumers (one Redis, and a
partitioned topic on a cluster)."""

import json

import pytest

from relay.codec import parse_record
from tests.helpers.admin import ok, ok_json, run
from tests.helpers.api import Api
from tests.helpers.store import bodies, queue
from tests.helpers.wire import FRAME_RESPONSE, Wire


def finished_topic(store, messages=3):
    """Topic t with retention on and channel c whose messages were all FINed."""
    store.subscribe("t", "c", "")
    store.history.set_retention("t", 3_600_000, 0)
    store.publish("t", [b"m%d" % i for i in range(messages)])
    records = store.deliver("t", "c", [("a", 60_000, messages)])[0]
    store.finish("t", "c", [("a", parse_record(r)[2]) for r in records])


def test_retention_shows_sets_and_turns_off(store, backend):
    ok(backend, "create", "t")
    assert ok(backend, "retention", "t") == [
        "t: retention off", "partition  retained  bytes  oldest  newest",
        "0          0         0      -       -"]
    assert ok(backend, "retention", "t", "--time", "24h", "--max-bytes", "1GB")[0] == \
        "t: retention time 24h, max bytes 1000000000"
    store.publish("t", [b"x" * 200])
    report = ok_json(backend, "retention", "t")
    assert (report["on"], report["time_ms"], report["max_bytes"]) == (True, 86_400_000, 10**9)
    assert [(p["retained"], p["bytes"]) for p in report["partitions"]] == [(1, 227)]
    assert ok(backend, "retention", "t", "--off")[0] == "t: retention off"
    assert ok_json(backend, "retention", "t")["partitions"][0]["retained"] == 0


def test_replay_after_fin_reads_the_same_messages(store, backend):
    finished_topic(store)
    assert ok(backend, "replay", "t", "c", "--since", "1h") == [
        "replayed 3 messages to t/c (0 skipped: in flight or deferred)"]
    assert bodies(queue(store, "t", "c")) == [b"m0", b"m1", b"m2"]
    result = ok_json(backend, "replay", "t/c", "--from-id", "0000000000000003")
    assert (result["replayed"], result["skipped"], result["total"]) == (1, 0, 1)


def test_replay_from_an_id_in_the_middle_of_an_mpub(store, backend):
    """An MPUB's messages share one entry of the history: --from-id of the second
    replays from it, not from the entry's start."""
    finished_topic(store, messages=5)
    result = ok_json(backend, "replay", "t/c", "--from-id", "0000000000000002")
    assert (result["replayed"], result["skipped"], result["total"]) == (4, 0, 4)
    assert bodies(queue(store, "t", "c")) == [b"m1", b"m2", b"m3", b"m4"]


def test_a_range_partly_retained_replays_what_is_kept_and_says_so(store, backend):
    finished_topic(store)
    result = run(backend, "replay", "t", "c", "--from-time", "2020-01-01T00:00:00Z")
    assert result.exit_code == 0
    assert result.stderr.startswith("relay-admin: topic t retains messages from ")
    assert result.stderr.endswith(" on: replaying from there\n")
    assert result.stdout == "replayed 3 messages to t/c (0 skipped: in flight or deferred)\n"


@pytest.mark.parametrize("args, code, line", [
    (["replay", "plain", "c", "--since", "1h"], 1,
     "relay-admin: topic plain keeps no history: retention is off (relay-admin retention "
     "plain --time 24h turns it on)"),
    (["replay", "t", "nope", "--since", "1h"], 1, "relay-admin: channel t/nope not found"),
    (["replay", "t", "c", "--from-time", "2099-01-01T00:00:00Z"], 1, None),
    (["replay", "t", "c", "--from-time", "yesterday"], 2,
     "relay-admin: Invalid value for '--from-time': not a time: 'yesterday' (use ISO 8601, "
     "e.g. 2026-11-25T10:00:00Z) (see relay-admin replay --help)"),
    (["replay", "t", "c", "--since", "2 hours"], 2,
     "relay-admin: Invalid value for '--since': not a duration: '2 hours' (use e.g. 250ms, "
     "60s, 15m, 1h) (see relay-admin replay --help)"),
    (["replay", "t", "c"], 2,
     "relay-admin: give one of --since, --from-time and --from-id (see relay-admin replay "
     "--help)"),
    (["replay", "t", "c", "--from-id", "xyz"], 2,
     "relay-admin: invalid message id 'xyz': 16 hex digits (see relay-admin replay --help)"),
])
def test_bad_input_is_one_line_and_changes_nothing(store, backend, args, code, line):
    finished_topic(store)
    store.subscribe("plain", "c", "")
    store.publish("plain", [b"p"])
    before = queue(store, "t", "c"), queue(store, "plain", "c")
    result = run(backend, *args)
    assert result.exit_code == code
    assert result.stdout == ""
    if line is None:    # the retained range has this run's times in it
        assert result.stderr.startswith("relay-admin: topic t retains nothing from "
                                        "2099-01-01T00:00:00.000Z to now: it retains ")
    else:
        assert result.stderr == line + "\n"
    assert (queue(store, "t", "c"), queue(store, "plain", "c")) == before


def test_create_from_earliest(store, backend):
    finished_topic(store)
    assert ok(backend, "create", "t", "late", "--from", "earliest") == [
        "created t/late with the 3 messages t retains"]
    assert bodies(queue(store, "t", "late")) == [b"m0", b"m1", b"m2"]
    assert ok(backend, "create", "t/later") == ["created t/later"]
    assert queue(store, "t", "later") == []
    again = run(backend, "create", "t/late", "--from", "earliest")
    assert (again.exit_code, again.stderr) == (1, (
        "relay-admin: channel t/late exists already: --from earliest makes a new one "
        "(relay-admin replay rewinds one)\n"))


def consume(tcp_port, topic, channel, n):
    """n messages read and FINed by a raw NSQ consumer: (id, body) of each, in order."""
    wire = Wire(tcp_port)
    wire.identify()
    assert wire.sub(topic, channel, rdy=n) == (FRAME_RESPONSE, b"OK")
    got = []
    for _ in range(n):
        _, _, msg_id, body = wire.message()
        wire.command(f"FIN {msg_id.decode()}")
        got.append((msg_id, body))
    assert wire.nothing()
    wire.close()
    return got


@pytest.mark.cluster    # on one Redis and on a cluster (tests/conftest.py)
def test_over_http_on_a_partitioned_topic(processes):
    """--retention-time and --topic-partitions on the broker: a topic of 3 parts keeps
    each part's history; a channel from the beginning and a rewind read the same
    messages, ids and all."""
    _, port = processes.broker("--retention-time", "1h", "--topic-partitions", "3")
    api = Api(port, processes.http_ports[port])
    api.request("POST", "/topic/create?topic=h")
    api.request("POST", "/channel/create?topic=h&channel=first")    # no backlog then
    for i in range(6):          # MPUBs go to the parts in turn
        assert api.request("POST", "/mpub?topic=h", b"%d-a\n%d-b" % (i, i))[0] == 200
    status, report = api.json("GET", "/topic/retention?topic=h")
    assert status == 200 and report["time_ms"] == 3_600_000
    assert [p["retained"] for p in report["partitions"]] == [4, 4, 4]
    status, created = api.json("POST", "/channel/create?topic=h&channel=c&from=earliest")
    assert (status, created["replayed"], created["skipped"]) == (200, 12, 0)
    first = consume(port, "h", "c", 12)
    assert sorted(body for _, body in first) == sorted(
        b"%d-%s" % (i, x) for i in range(6) for x in (b"a", b"b"))
    status, replayed = api.json("POST", "/channel/replay?topic=h&channel=c&since=1h")
    assert (status, replayed["replayed"], replayed["clipped"]) == (200, 12, True)
    assert sorted(consume(port, "h", "c", 12)) == sorted(first)


def test_http_errors(processes):
    _, port = processes.broker()
    api = Api(port, processes.http_ports[port])
    api.request("POST", "/topic/create?topic=t")
    api.request("POST", "/channel/create?topic=t&channel=c")
    for path, code, message in [
            ("/channel/replay?topic=t&channel=c&since=1h", 400, "NO_HISTORY"),
            ("/channel/replay?topic=t&channel=x&since=1h", 404, "CHANNEL_NOT_FOUND"),
            ("/channel/replay?topic=t&channel=c&since=soon", 400, "INVALID_ARG_SINCE"),
            ("/channel/replay?topic=t&channel=c", 400, "MISSING_ARG_SINCE"),
            ("/topic/retention?topic=t&time=forever", 400, "INVALID_ARG_TIME"),
            ("/channel/create?topic=t&channel=d&from=middle", 400, "INVALID_ARG_FROM")]:
        assert api.json("POST", path) == (code, {"message": message}), path
    status, report = api.json("POST", "/topic/retention?topic=t&time=2h&max_bytes=1MiB")
    assert (status, report["time_ms"], report["max_bytes"]) == (200, 7_200_000, 1_048_576)
    assert json.loads(api.request("POST", "/topic/retention?topic=t&off=true")[1])["on"] is False
    assert api.json("POST", "/channel/create?topic=t&channel=c&from=earliest") == (
        400, {"message": "CHANNEL_EXISTS"})

