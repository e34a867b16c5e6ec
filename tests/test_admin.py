"""relay-admin through click's CliRunner, on fakeredis and on the embedded redis-server."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from relay import admin
from relay.admin import messages, reading, steering, text
from relay.broker import transport
from relay.broker.client import announcement, client_stats
from relay.broker.registry import Registry
from relay.store import stats
from relay.store import Store
from relay.store.connection import connect
from workers import operations
from tests.helpers.admin import ok, ok_json, run
from tests.helpers.jobs import work

README = Path(__file__).resolve().parent.parent / "README.md"
KEYS_PY = Path(admin.__file__).parent.parent / "store" / "keys.py"


def announce(backend, broker_id, port, *clients):
    """Register a broker and its clients as a broker's heartbeat does."""
    registry = Registry(backend, broker_id)
    registry.info = {"hostname": "h", "broadcast_address": "127.0.0.1",
                     "remote_address": f"127.0.0.1:{port}", "tcp_port": port,
                     "http_port": port + 1, "version": "1.3.0"}
    registry.clients = lambda: json.dumps(list(clients))
    registry.announce()


def client(topic, channel, owner, client_id, port, **counts):
    """What a broker announces for one client (client_stats of a connection)."""
    conn = SimpleNamespace(client_id=client_id, hostname=client_id,
                           remote_address=f"10.0.0.1:{port}", ready_count=10,
                           in_flight=[b"x"] * counts.get("in_flight", 0),
                           message_count=counts.get("messages", 0), finish_count=0,
                           requeue_count=0, connect_ts=1_800_000_000, sample_rate=0,
                           user_agent="gnsq/1.0.2", tls=False, snappy=False, deflate=False,
                           tls_details=transport.NO_TLS)
    return {"topic": topic, "channel": channel, "owner": owner, **client_stats(conn)}


def test_stats_table_and_json(store, backend):
    store.publish("orders", [b"a", b"b"])
    store.subscribe("orders", "billing", "b1")
    store.publish("orders", [b"c"])
    store.deliver("orders", "billing", [("b1:1", 60000, 1)])
    store.publish("orders", [b"d"], defer_ms=60000)
    store.control.pause_channel("orders", "billing", True)
    # b1 is not a live broker (it never announced itself): its consumer is not counted

    assert ok(backend, "stats") == [
        "topic   channel  depth  in_flight  deferred  messages  requeued  timed_out  dead"
        "  deleted  expired  overflowed  clients  paused",
        "orders           0                 0         4                                          "
        "                                 no",
        "        billing  2      1          1         4         0         0          0     0     "
        "   0        0           0        yes",
    ]
    [topic] = ok_json(backend, "stats", "orders/billing")["topics"]
    assert topic["channels"] == [{
        "channel_name": "billing", "paused": True, "ephemeral": False, "depth": 2,
        "in_flight_count": 1, "deferred_count": 1, "message_count": 4, "requeue_count": 0,
        "timeout_count": 0, "dead_count": 0, "deleted_count": 0, "expired_count": 0,
        "overflow_count": 0, "client_count": 0, "backend_depth": 2, "ordered": False,
        "order_keys_out": 0, "order_waiting": 0, "rate_limit": None,
        "e2e_processing_latency": {"count": 0, "percentiles": None},
        "depth_by_priority": {"0": 2}, "clients": []}]


def test_a_clients_announcement_is_encoded_again_when_its_figures_change():
    conn = SimpleNamespace(**{k: v for k, v in client("t", "c", "b1:1", "w", 5001).items()
                              if k not in ("in_flight_count", "topic", "channel")},
                           in_flight=[], tls_details=transport.NO_TLS, announced=None,
                           channel=SimpleNamespace(topic="t", name="c"))
    first = announcement(conn)
    assert json.loads(first) == client("t", "c", "b1:1", "w", 5001)
    assert announcement(conn) is first    # unchanged: not encoded again
    conn.in_flight = [b"x"]
    conn.message_count = 1
    assert json.loads(announcement(conn)) == client("t", "c", "b1:1", "w", 5001,
                                                          in_flight=1, messages=1)
    for figure in ("ready_count", "finish_count", "requeue_count"):
        setattr(conn, figure, 7)
        assert json.loads(announcement(conn))[figure] == 7


def test_stats_and_brokers_show_every_brokers_clients(store, backend):
    store.subscribe("orders", "billing", "b1")
    store.subscribe("orders", "billing", "b2")
    store.publish("orders", [b"a"])
    one = client("orders", "billing", "b1:4", "worker-1", 5001, in_flight=1, messages=7)
    two = client("orders", "billing", "b2:1", "worker-2", 5002)
    announce(backend, "b1", 4150, one)
    announce(backend, "b2", 4160, two)

    assert ok(backend, "stats") == [
        "topic   channel  depth  in_flight  deferred  messages  requeued  timed_out  dead"
        "  deleted  expired  overflowed  clients  paused",
        "orders           0                 0         1                                          "
        "                                 no",
        "        billing  1      0          0         1         0         0          0     0     "
        "   0        0           2        no",
        "",
        "broker  channel         client    address        user_agent  ready  in_flight"
        "  messages  finished  requeued  connected",
        "b1      orders/billing  worker-1  10.0.0.1:5001  gnsq/1.0.2  10     1          7"
        "         0         0         2027-01-15T08:00:00.000Z",
        "b2      orders/billing  worker-2  10.0.0.1:5002  gnsq/1.0.2  10     0          0"
        "         0         0         2027-01-15T08:00:00.000Z",
    ]
    [channel] = ok_json(backend, "stats")["topics"][0]["channels"]
    assert channel["clients"] == [{"broker": "b1", **one}, {"broker": "b2", **two}]

    assert ok(backend, "brokers")[:3] == [
        "broker  address         http_port  version  clients",
        "b1      127.0.0.1:4150  4151       1.3.0    1",
        "b2      127.0.0.1:4160  4161       1.3.0    1",
    ]
    brokers = ok_json(backend, "brokers")["brokers"]
    assert [(b["id"], b["tcp_port"], b["clients"]) for b in brokers] == [
        ("b1", "4150", [{"broker": "b1", **one}]), ("b2", "4160", [{"broker": "b2", **two}])]
    assert 0 < backend.pttl("relay:broker:b1:clients") <= 15_000


def test_stats_watch_redraws_in_place(store, backend, monkeypatch):
    store.subscribe("t", "c", "")
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt
        store.publish("t", [b"m"])

    monkeypatch.setattr(reading.time, "sleep", sleep)
    result = run(backend, "stats", "t/c", "--watch", "2", color=True)
    assert (result.exit_code, sleeps) == (0, [2.0, 2.0])
    header = ("topic  channel  depth  in_flight  deferred  messages  requeued  timed_out"
              "  dead  deleted  expired  overflowed  clients  paused")
    assert result.output == (
        f"\x1b[H\x1b[J{header}\n"
        "t               0                 0         0                                          "
        "                                 no\n"
        "       c        0      0          0         0         0         0          0     0     "
        "   0        0           0        no\n"
        f"\x1b[H\x1b[J{header}\n"
        "t               0                 0         1                                          "
        "                                 no\n"
        "       c        1      0          0         1         0         0          0     0     "
        "   0        0           0        no\n")
    sleeps.clear()
    lines = run(backend, "stats", "t", "--watch", "1", "--json").output.splitlines()
    assert [json.loads(line)["topics"][0]["channels"][0]["depth"] for line in lines] == [1, 2]


def test_topics_and_channels(store, backend):
    assert ok(backend, "topics") == ["no topics"]
    store.subscribe("orders", "billing", "b1")
    announce(backend, "b1", 4150, client("orders", "billing", "b1:1", "worker-1", 5001))
    store.control.create_channel("orders", "audit")
    store.control.create_topic("idle")
    store.control.pause_topic("idle", True)
    assert ok(backend, "topics") == ["topic   channels  paused",
                                     "idle    0         yes",
                                     "orders  2         no"]
    assert ok_json(backend, "topics") == {"topics": [
        {"topic": "idle", "channels": 0, "paused": True},
        {"topic": "orders", "channels": 2, "paused": False}]}
    assert ok(backend, "channels", "orders") == ["channel  clients  paused",
                                                 "audit    0        no",
                                                 "billing  1        no"]
    assert ok_json(backend, "channels", "orders") == {"topic": "orders", "channels": [
        {"channel": "audit", "clients": 0, "paused": False},
        {"channel": "billing", "clients": 1, "paused": False}]}
    assert ok(backend, "channels", "idle") == ["idle has no channels"]


def test_create_pause_unpause(store, backend):
    assert run(backend, "create", "orders/billing").exit_code == 1  # as /channel/create
    assert store.reads.topic_names() == []
    assert ok(backend, "create", "orders") == ["created orders"]
    assert ok(backend, "create", "orders") == ["orders exists already"]
    assert ok_json(backend, "create", "orders/billing") == {"target": "orders/billing",
                                                            "created": True}
    assert store.reads.channel_names("orders") == ["billing"]
    assert ok(backend, "pause", "orders/billing") == ["paused orders/billing"]
    assert store.reads.read_channel("orders", "billing")["paused"] is True
    assert ok_json(backend, "pause", "orders") == {"target": "orders", "paused": True}
    assert store.reads.read_topic("orders")["paused"] is True
    assert ok(backend, "unpause", "orders") == ["unpaused orders"]
    assert ok(backend, "unpause", "orders/billing") == ["unpaused orders/billing"]
    assert (store.reads.read_topic("orders")["paused"],
            store.reads.read_channel("orders", "billing")["paused"]) == (False, False)


def test_pub_from_stdin_and_file_in_batches(store, backend, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)     # relay's default options
    store.subscribe("t", "c", "b1")
    calls = []
    publish = store.publish
    monkeypatch.setattr(Store, "publish", lambda self, t, bodies: (
        calls.append(len(bodies)), publish(t, bodies))[1])
    monkeypatch.setattr(messages, "PUB_BATCH", 2)
    assert ok(backend, "pub", "t", input="one\ntwo\n\nthree\r\n") == [
        "published 3 messages to t"]
    path = tmp_path / "messages"
    path.write_bytes(b"four\nfive")
    assert ok_json(backend, "pub", "t", "--file", str(path)) == {"topic": "t", "published": 2}
    assert calls == [2, 1, 2]
    delivered = store.deliver("t", "c", [("b1:1", 60000, 10)])[0]
    assert [r[26:] for r in delivered] == [b"one", b"two", b"three", b"four", b"five"]


def test_pub_keeps_to_max_msg_size_and_max_body_size(store, backend, monkeypatch, tmp_path):
    """A line over --max-msg-size is refused with one line and, as nsqd's /mpub refuses
    the whole body, nothing is published; batches stay within --max-body-size."""
    monkeypatch.chdir(tmp_path)
    for name in ("RELAY_CONFIG", "RELAY_MAX_MSG_SIZE", "RELAY_MAX_BODY_SIZE"):
        monkeypatch.delenv(name, raising=False)
    store.subscribe("t", "c", "b1")
    calls = []
    publish = store.publish
    monkeypatch.setattr(Store, "publish", lambda self, t, bodies: (
        calls.append([len(b) for b in bodies]), publish(t, bodies))[1])
    result = run(backend, "pub", "t", input="fine\n" + "x" * 2_000_000 + "\n")
    assert (result.exit_code, result.output) == (
        1, "relay-admin: line 2: 2000000 bytes, over --max-msg-size 1048576 (MSG_TOO_BIG): "
           "nothing published\n")
    monkeypatch.setenv("RELAY_MAX_MSG_SIZE", "10")
    monkeypatch.setenv("RELAY_MAX_BODY_SIZE", "25")
    result = run(backend, "pub", "t", input="fine\n" + "x" * 11 + "\nok\n" + "y" * 12)
    assert (result.exit_code, result.output) == (1, "".join(
        f"relay-admin: line {n}: {size} bytes, over --max-msg-size 10 (MSG_TOO_BIG): "
        "nothing published\n" for n, size in ((2, 11), (4, 12))))
    assert calls == [] and store.reads.read_channel("t", "c")["depth"] == 0
    assert ok(backend, "pub", "t", input="123456789\n" * 5 + "0123456789\n") == [
        "published 6 messages to t"]
    assert calls == [[9, 9], [9, 9], [9, 10]]    # /mpub bodies of 20, 20 and 21 bytes


def test_inflight_lists_ids_owners_attempts_and_deadlines(store, backend):
    store.subscribe("t", "c", "b1")
    store.publish("t", [b"a", b"b", b"c"])
    store.deliver("t", "c", [("b1:4", 30000, 1)])
    store.requeue("t", "c", [("b1:4", b"0000000000000001", 0)])
    store.deliver("t", "c", [("b1:4", 60000, 2), ("b2:1", 90000, 1)])
    announce(backend, "b1", 4150, client("t", "c", "b1:4", "worker", 5001))
    rows = stats.in_flight(store, "t", "c", 10)
    assert [(m["id"], m["owner"], m["attempts"]) for m in rows] == [
        ("0000000000000002", "b1:4", 1), ("0000000000000003", "b1:4", 1),
        ("0000000000000001", "b2:1", 2)]
    deadlines = [text.utc(m["deadline_ms"]) for m in rows]
    assert ok(backend, "inflight", "t/c") == [
        "id                attempts  deadline                  broker  client",
        f"0000000000000002  1         {deadlines[0]}  b1      10.0.0.1:5001",
        f"0000000000000003  1         {deadlines[1]}  b1      10.0.0.1:5001",
        f"0000000000000001  2         {deadlines[2]}  b2      #1",
    ]
    assert ok(backend, "inflight", "t/c", "-n", "1")[-1] == "(1 of 3 shown, those due first)"
    data = ok_json(backend, "inflight", "t/c", "-n", "1")
    assert data == {"in_flight_count": 3, "messages": [{
        "id": "0000000000000002", "attempts": 1, "deadline": rows[0]["deadline_ms"],
        "broker": "b1", "connection": 4, "client": "10.0.0.1:5001"}]}
    store.control.empty_channel("t", "c")
    assert ok(backend, "inflight", "t/c") == ["nothing in flight on t/c"]


def test_requeue_ids_and_all(store, backend):
    store.subscribe("t", "c", "b1")
    store.publish("t", [b"a", b"b", b"c", b"d"])
    store.deliver("t", "c", [("b1:1", 60000, 2), ("b2:1", 60000, 2)])
    assert ok(backend, "requeue", "t/c", "0000000000000003") == [
        "id                result", "0000000000000003  requeued"]
    result = run(backend, "requeue", "t/c", "0000000000000001", "0000000000000003", "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {"requeued": ["0000000000000001"],
                                         "not_in_flight": ["0000000000000003"]}
    assert result.stderr == "relay-admin: 1 of 2 messages were not in flight on t/c\n"
    assert ok(backend, "requeue", "t/c", "--all") == ["requeued 2 messages in flight on t/c"]
    c = store.reads.read_channel("t", "c")
    assert (c["depth"], c["in_flight_count"], c["requeue_count"]) == (4, 0, 4)


def setup_channel(store, topic):
    """A channel holding ready, in-flight and deferred messages, and a second one."""
    store.subscribe(topic, "c", "b1")
    store.subscribe(topic, "d", "b1")
    store.publish(topic, [b"a", b"b", b"c"])
    store.publish(topic, [b"later"], defer_ms=60000)
    store.deliver(topic, "c", [("b1:1", 60000, 2)])


@pytest.mark.parametrize("args, expected", [
    (("empty", "c"), "emptied {t}/c: 4 messages dropped (ids up to 0000000000000004)"),
    (("delete", "c"), "deleted {t}/c: 4 messages dropped (ids up to 0000000000000004)"),
    (("empty", ""), "emptied {t}: 0 messages dropped (ids up to 0000000000000004)"),
    (("delete", ""), "deleted {t}: 8 messages dropped (ids up to 0000000000000004)"),
    (("requeue", "c"), "requeued 2 messages in flight on {t}/c"),
])
def test_operations_inline_and_as_rq_jobs_do_the_same(store, backend, args, expected):
    operation, channel = args
    extra = ("--all",) if operation == "requeue" else ()
    for topic in ("inline", "job"):
        setup_channel(store, topic)
    target = "{t}/c" if channel else "{t}"
    assert ok(backend, operation, target.format(t="inline"), *extra) == [
        expected.format(t="inline")]
    [queued] = ok(backend, operation, target.format(t="job"), *extra, "--background")
    assert re.fullmatch(rf"queued job \S+: {operation} {target.format(t='job')} "
                        r"\(relay-admin jobs shows it\)", queued)
    work(backend)
    [job] = operations.all_jobs(backend)
    inline, queued = (Store(backend).redis.keys(f"relay:{{{t}}}:*") for t in ("inline", "job"))
    assert sorted(k.replace(b"{inline}", b"{job}") for k in inline) == sorted(queued)
    assert [stats_of(store, t) for t in ("inline", "job")] == [stats_of(store, "job")] * 2
    assert text.summary(job.return_value()) == expected.format(t="job")


def stats_of(store, topic):
    return [(name, store.reads.read_channel(topic, name)) for name in store.reads.channel_names(topic)]


def test_jobs_lists_state_and_progress(store, backend):
    setup_channel(store, "t")
    queued = ok_json(backend, "empty", "t/c", "--background")
    assert (queued["status"], queued["operation"], queued["target"]) == ("queued", "empty", "t/c")
    assert ok(backend, "jobs")[1].split() == [queued["job"], "empty", "t/c", "queued", "-"]
    work(backend)
    store.subscribe("t", "gone", "")
    failing = ok_json(backend, "delete", "t/gone", "--background")
    store.control.delete_channel("t", "gone")
    work(backend)
    assert [line.split() for line in ok(backend, "jobs")] == [
        ["job", "operation", "target", "state", "progress"],
        [queued["job"], "empty", "t/c", "finished", "100%", "(7/7)"],
        [failing["job"], "delete", "t/gone", "failed", "-"]]
    listed = ok_json(backend, "jobs")["jobs"]
    assert [(j["job"], j["state"], j["done"], j["total"]) for j in listed] == [
        (queued["job"], "finished", 7, 7), (failing["job"], "failed", None, None)]


def test_big_operation_needs_a_worker_unless_background(store, backend, monkeypatch):
    setup_channel(store, "t")
    monkeypatch.setattr(steering, "INLINE_LIMIT", 2)
    result = run(backend, "empty", "t/c")
    assert (result.exit_code, result.output) == (
        1, "relay-admin: no `relay jobs` worker is running: start one, or pass --background "
           "to queue the job\n")
    assert store.reads.read_channel("t", "c")["depth"] == 1


NAME_RULE = "1-64 characters of [.a-zA-Z0-9_-], optionally ending in #ephemeral"


@pytest.mark.parametrize("args, message", [
    (("stats", "nope"), "topic 'nope' not found"),
    (("stats", "t/nope"), "channel t/nope not found"),
    (("stats", "bad name!"), f"invalid name 'bad name!': {NAME_RULE}"),
    (("channels", "nope"), "topic 'nope' not found"),
    (("pause", "t/nope"), "channel t/nope not found"),
    (("unpause", "nope"), "topic 'nope' not found"),
    (("create", "t/bad/name"), f"invalid name 'bad/name': {NAME_RULE}"),
    (("create", "nope/c"), "topic 'nope' not found: create it first (as /channel/create asks)"),
    (("empty", "nope"), "topic 'nope' not found"),
    (("delete", "t/nope"), "channel t/nope not found"),
    (("pub", "bad name"), f"invalid name 'bad name': {NAME_RULE}"),
    (("tail", "nope"), "topic 'nope' not found"),
    (("tail", "t"), "no live broker in the registry: start `relay broker`, or pass --broker"),
    (("tail", "t", "--broker", "127.0.0.1:1"), "cannot tail t on 127.0.0.1:1: "
                                               "[Errno 111] Connection refused"),
    (("inflight", "t"), "'t' names no channel: give TOPIC/CHANNEL"),
    (("inflight", "t/nope"), "channel t/nope not found"),
    (("requeue", "t/c"), "give --all or message ids (not both)"),
    (("requeue", "t/c", "--all", "0000000000000001"), "give --all or message ids (not both)"),
    (("requeue", "t/c", "xyz"), "invalid message id 'xyz': 16 hex digits"),
])
def test_errors_exit_1_with_one_line(store, backend, args, message):
    store.subscribe("t", "c", "")
    result = run(backend, *args)
    assert (result.exit_code, result.output) == (1, f"relay-admin: {message}\n")
    assert store.reads.topic_names() == ["t"]


@pytest.mark.parametrize("args,message", [
    (("stats", "--foo"), "No such option '--foo' (see relay-admin stats --help)"),
    (("--foo", "stats"), "No such option '--foo' (see relay-admin --help)"),
    (("nope",), "No such command 'nope' (see relay-admin --help)"),
    (("inflight",), "Missing argument 'TOPIC/CHANNEL' (see relay-admin inflight --help)"),
    (("inflight", "t/c", "-n", "0"), "Invalid value for '-n' / '--limit': 0 is not in the "
                                     "range x>=1 (see relay-admin inflight --help)"),
])
def test_usage_errors_exit_2_with_one_line(backend, args, message):
    result = run(backend, *args)
    assert (result.exit_code, result.output) == (2, f"relay-admin: {message}\n")


def test_redis_url_before_or_after_the_command(single_redis_url, monkeypatch):
    Store(connect(single_redis_url)).control.create_topic("here")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("RELAY_REDIS_URL", "redis://127.0.0.1:2/0")
    for args in (["--redis-url", single_redis_url, "topics"],
                 ["topics", "--redis-url", single_redis_url],
                 ["--redis-url", "redis://127.0.0.1:3/0", "topics", "--redis-url",
                  single_redis_url]):
        result = CliRunner().invoke(admin.main, args)
        assert (result.exit_code, result.output) == (0, "topic  channels  paused\n"
                                                        "here   0         no\n"), args
    result = CliRunner().invoke(admin.main, ["topics"])
    assert result.output.startswith("relay-admin: redis at redis://127.0.0.1:2/0 is ")
    monkeypatch.delenv("RELAY_REDIS_URL")
    result = CliRunner().invoke(admin.main, ["topics"])
    assert result.output.startswith("relay-admin: redis at redis://127.0.0.1:1/0 is ")
    Store(connect(single_redis_url)).redis.flushdb()


def test_help_names_the_redis_url_variables():
    top = CliRunner().invoke(admin.main, ["--help"]).output
    assert "[env var: RELAY_REDIS_URL,\n                   REDIS_URL; default:" in top
    command = " ".join(CliRunner().invoke(admin.main, ["stats", "--help"]).output.split())
    assert ("--redis-url URL Redis holding relay's state; default: the one given before the "
            "command, else RELAY_REDIS_URL, else REDIS_URL, else redis://127.0.0.1:6379/0"
            ) in command


@pytest.mark.parametrize("args", [
    ["topics"], ["channels", "t"], ["stats"], ["stats", "t/c", "--watch", "1"],
    ["pause", "t"], ["unpause", "t/c"], ["empty", "t/c"], ["delete", "t"], ["create", "t"],
    ["pub", "t"], ["tail", "t"], ["inflight", "t/c"], ["requeue", "t/c", "--all"],
    ["brokers"], ["jobs"]])
def test_every_command_when_redis_is_unreachable(args):
    result = CliRunner().invoke(admin.main, [*args, "--redis-url", "redis://127.0.0.1:1/0"],
                                input="m\n")
    assert result.exit_code == 1
    assert result.output.startswith(
        "relay-admin: redis at redis://127.0.0.1:1/0 is unreachable: ")
    assert len(result.output.splitlines()) == 1


# -- the README's key list and redis-cli commands --------------------------------------


def readme_block(after: str) -> str:
    """The indented block that follows the line `after` (and a blank line) in README.md."""
    lines = README.read_text().split(after + "\n\n", 1)[1].splitlines()
    block = []
    for line in lines:
        if not line.startswith("    "):
            break
        block.append(line)
    return "\n".join(block)


def test_readme_key_list_mirrors_keys_py():
    docstring = KEYS_PY.read_text().split('"""', 2)[1]
    keys_block = docstring[docstring.index("    relay:"):].rstrip()
    assert readme_block("Redis keys (the same list as `relay/store/keys.py`):") == keys_block


def test_readme_redis_cli_commands_agree_with_stats(redis_url, monkeypatch):
    store = Store(connect(redis_url))
    store.redis.flushdb()
    store.subscribe("orders", "billing", "b1")
    store.publish("orders", [b"a", b"b", b"c", b"d", b"e"])
    store.publish("orders", [b"later"], defer_ms=60000)
    store.run(store.deliver_op("orders", "billing", [("b1:1", 60000, 2)], lots=True))
    store.dedup.publish_keyed("orders", [b"urgent"], None, 0, None, [7])
    cli = str(Path(sys.executable).with_name("redis-cli"))     # .venv/bin/redis-cli
    counts = {}
    commands = readme_block("For a channel (here `orders/billing`), with `redis-cli` "
                            "(`.venv/bin/redis-cli`):")
    for line in commands.splitlines():
        command, _, name = line.partition("#")
        argv = shlex.split(command.replace("$REDIS_URL", redis_url))
        assert argv[:3] == ["redis-cli", "-u", redis_url]
        out = subprocess.run([cli, *argv[1:]], capture_output=True, text=True, check=True)
        values = out.stdout.split()     # HGETALL: field, value, field, value ...
        counts[name.strip()] = int(out.stdout) if len(values) == 1 else \
            sum(map(int, values[1::2]))
    monkeypatch.setenv("REDIS_URL", redis_url)
    result = CliRunner().invoke(admin.main, ["stats", "orders/billing", "--json"])
    channel = json.loads(result.stdout)["topics"][0]["channels"][0]
    members, lotted = counts.pop("in flight: members"), counts.pop(
        "in flight: in lots, beyond one each")
    counts["in flight"] = members + lotted
    assert (members, lotted) == (1, 1)
    counts["depth"] = counts.pop("depth: priority 0") + counts.pop("depth: priority, count, ...")
    assert counts == {"depth": channel["depth"], "in flight": channel["in_flight_count"],
                      "deferred": channel["deferred_count"]} == {
        "depth": 4, "in flight": 2, "deferred": 1}
    store.redis.flushdb()
