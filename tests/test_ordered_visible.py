"""Ordered channels made visible (issue 48 item 6): read_channel and the store's /stats
view count a channel's keys with a message out and the messages waiting behind them;
relay-admin stats, inflight, peek and msg show them and the messages' order keys, and msg
finds and deletes a message waiting behind its key; on fakeredis, the embedded
redis-server and a cluster. Then a real broker's /stats and /metrics."""

import pytest

from relay.admin.text import utc
from relay.codec import parse_record
from relay.store import stats
from relay.store.keys import ChannelKeys
from tests.helpers.admin import ok, ok_json, run
from tests.helpers.api import Api
from tests.helpers.store import empty_channel, ids, ordered, publish_ordered

ORDER = ("ordered", "order_keys_out", "order_waiting")
MSG_HEAD = "channel  state      attempts  position  due                       broker  client  key"






def published_at(store, topic="t", channel="c") -> str:
    """The publish time relay-admin shows of the head of the channel's queue."""
    record = store.redis.lindex(ChannelKeys.of(topic, channel).queue, 0)
    return utc(parse_record(record)[0] // 1_000_000)


def order_figures(entry: dict) -> tuple:
    return tuple(entry[name] for name in ORDER)


@pytest.fixture
def keyed(store):
    """t/c ordered, t/plain not (made as /channel/create does: no consumer): a1 b1 a2
    a3 u1 published in one call (ids 1-5), then a4 deferred a minute (id 6): on t/c, a1
    b1 u1 queued, a2 a3 a4 waiting behind a1."""
    ordered(store)
    store.subscribe("t", "plain", "")
    publish_ordered(store, [("a", b"a1"), ("b", b"b1"), ("a", b"a2"), ("a", b"a3"), (None, b"u1")])
    publish_ordered(store, [("a", b"a4")], defer_ms=60_000)
    return store


def test_read_channel_counts_the_keys_out_and_the_messages_waiting(keyed):
    store = keyed
    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=6, message_count=6, client_count=1, ordered=True, order_keys_out=2,
        order_waiting=3)
    assert store.reads.read_channel("t", "plain") == empty_channel(depth=5, deferred_count=1,
                                                             message_count=6)
    [topic] = stats.collect(store)["topics"]
    assert [(c["channel_name"], order_figures(c)) for c in topic["channels"]] == [
        ("c", (True, 2, 3)), ("plain", (False, 0, 0))]
    [a1, b1, u1] = store.deliver("t", "c", [("b1:1", 60_000, 10)])[0]
    assert store.finish("t", "c", [("b1:1", ids([a1])[0])]) == [1]    # a2 goes out
    assert order_figures(store.reads.read_channel("t", "c")) == (True, 2, 2)
    assert store.finish("t", "c", [("b1:1", i) for i in ids([b1, u1])]) == [1, 1]
    assert order_figures(store.reads.read_channel("t", "c")) == (True, 1, 2)   # b: nothing left
    assert store.ordering.set_ordered("t", "c", False) == 2        # a3 queued, a4 deferred
    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=2, deferred_count=1, message_count=6, client_count=1)


def test_a_partitioned_channel_sums_its_parts_and_is_ordered_once(store, backend):
    """Keys d (part 0) and a (part 1): each part counts its own, the sum both; ordered
    is part 0's, as paused is, not a sum."""
    store.control.set_partitions("t", 2)
    ordered(store)
    publish_ordered(store, [("d", b"d1"), ("d", b"d2"), ("a", b"a1"), ("a", b"a2"), ("a", b"a3")])
    parts = store.reads.read_channel_parts("t", "c")
    assert [(p["depth"], *order_figures(p)) for p in parts] == [
        (2, True, 1, 1), (3, True, 1, 2)]
    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=5, message_count=5, client_count=1, ordered=True, order_keys_out=2,
        order_waiting=3)
    [topic] = stats.collect(store, by_part=True)["topics"]
    [channel] = topic["channels"]
    assert order_figures(channel) == (True, 2, 3)
    assert [order_figures(p) for p in channel["parts"]] == [(True, 1, 1), (True, 1, 2)]
    assert ok(backend, "msg", "t", "0001000000000003") == [
        f"message 0001000000000003 of t, published {published_at(store, store.parts('t')[1])}, "
        "body \"a3\"",
        "channel  state    attempts  position  due  broker  client  key",
        "c        waiting  0         2         -    -       -       a"]
    assert [row.split()[:4] for row in ok(backend, "peek", "t", "c", "--waiting")] == [
        ["part", "position", "due", "key"], ["0", "1", "-", "d"], ["1", "1", "-", "a"],
        ["1", "2", "-", "a"]]


def test_stats_table_adds_the_order_columns_when_a_channel_is_ordered(keyed, backend):
    assert ok(backend, "stats") == [
        "topic  channel  depth  in_flight  deferred  messages  requeued  timed_out  dead"
        "  deleted  expired  overflowed  clients  paused  ordered  keys_out  waiting",
        "t               0                 0         6                                    "
        "                                       no",
        "       c        6      0          0         6         0         0          0     0"
        "        0        0           0        no      yes      2         3",
        "       plain    5      0          1         6         0         0          0     0"
        "        0        0           0        no      no       0         0",
    ]
    [topic] = ok_json(backend, "stats", "t/c")["topics"]
    assert [order_figures(c) for c in topic["channels"]] == [(True, 2, 3)]
    assert ok(backend, "stats", "t/plain")[0].endswith("clients  paused")  # none ordered


def test_inflight_shows_each_messages_order_key_on_an_ordered_channel(keyed, backend):
    store = keyed
    store.deliver("t", "c", [("b1:4", 60_000, 2), ("b2:1", 90_000, 1)])
    rows = stats.in_flight(store, "t", "c", 10)
    assert [(m["id"], m["owner"], m["key"]) for m in rows] == [
        ("0000000000000001", "b1:4", "a"), ("0000000000000002", "b1:4", "b"),
        ("0000000000000005", "b2:1", None)]
    deadlines = [utc(m["deadline_ms"]) for m in rows]
    assert ok(backend, "inflight", "t/c") == [
        "id                attempts  deadline                  broker  client  key",
        f"0000000000000001  1         {deadlines[0]}  b1      #4      a",
        f"0000000000000002  1         {deadlines[1]}  b1      #4      b",
        f"0000000000000005  1         {deadlines[2]}  b2      #1      -"]
    assert ok_json(backend, "inflight", "t/c", "-n", "1") == {"in_flight_count": 3, "messages": [{
        "id": "0000000000000001", "attempts": 1, "deadline": rows[0]["deadline_ms"],
        "broker": "b1", "connection": 4, "client": None, "key": "a"}]}
    store.deliver("t", "plain", [("b1:4", 60_000, 1)])
    assert ok(backend, "inflight", "t/plain")[0] == \
        "id                attempts  deadline                  broker  client"


def test_peek_shows_keys_and_the_messages_waiting_behind_them(keyed, backend):
    store = keyed
    published = published_at(store)
    c = ChannelKeys.of("t", "c")
    [a4] = [w for w in store.ordering.waiting_in("t", "c") if w.id == b"0000000000000006"]
    due6 = a4.due_ms
    later = utc(parse_record(a4.record)[0] // 1_000_000)
    assert ok(backend, "peek", "t", "c") == [
        "part  position  key  id                attempts  published                 body",
        f"0     1         a    0000000000000001  0         {published}  \"a1\"",
        f"0     2         b    0000000000000002  0         {published}  \"b1\"",
        f"0     3         -    0000000000000005  0         {published}  \"u1\""]
    assert ok(backend, "peek", "t", "c", "--waiting", "-n", "5") == [
        "part  position  due                       key  id                attempts  published"
        "                 body",
        f"0     1         -                         a    0000000000000003  0         "
        f"{published}  \"a2\"",
        f"0     2         -                         a    0000000000000004  0         "
        f"{published}  \"a3\"",
        f"0     3         {utc(due6)}  a    0000000000000006  0         {later}  \"a4\""]
    data = ok_json(backend, "peek", "t", "c", "--waiting", "-n", "1")
    assert data["waiting"] == [{
        "id": "0000000000000003", "timestamp": data["waiting"][0]["timestamp"],
        "attempts": 0, "priority": 0, "part": 0, "key": "a", "position": 1, "due_ms": None,
        "body_base64": "YTI="}]
    store.deliver("t", "c", [("b1:1", 60_000, 3)])
    store.finish("t", "c", [("b1:1", b"0000000000000002")])      # b: free
    publish_ordered(store, [("b", b"b2")], defer_ms=60_000)                   # out, deferred
    due7 = int(store.redis.zscore(c.deferred, "0000000000000007"))
    assert [row.split()[:4] for row in ok(backend, "peek", "t", "c", "--deferred")] == [
        ["part", "due", "key", "id"], ["0", utc(due7), "b", "0000000000000007"]]
    assert ok(backend, "peek", "t", "plain", "--waiting") == ["nothing waiting on t/plain"]
    assert ok(backend, "peek", "t", "plain", "-n", "1")[0] == \
        "part  position  id                attempts  published                 body"
    assert store.reads.read_channel("t", "c")["order_waiting"] == 3       # peek took nothing
    result = run(backend, "peek", "t", "c", "--waiting", "--deferred")
    assert (result.exit_code, result.output) == (2, "relay-admin: --deferred and --waiting "
                                                    "do not go together (see relay-admin "
                                                    "peek --help)\n")


def test_msg_finds_a_message_waiting_behind_its_key(keyed, backend):
    store = keyed
    published = published_at(store)
    store.deliver("t", "c", [("b1:4", 60_000, 1)])                   # a1 in flight
    deadline = utc(stats.in_flight(store, "t", "c", 1)[0]["deadline_ms"])
    assert ok(backend, "msg", "t", "0000000000000004") == [
        f"message 0000000000000004 of t, published {published}, body \"a3\"",
        "channel  state    attempts  position  due  broker  client  key",
        "c        waiting  0         2         -    -       -       a",
        "plain    queued   0         4         -    -       -       -"]
    assert ok(backend, "msg", "t", "0000000000000001") == [
        f"message 0000000000000001 of t, published {published}, body \"a1\"",
        MSG_HEAD,
        f"c        in flight  1         -         {deadline}  b1      #4      a",
        "plain    queued     0         1         -                         -       -       -"]
    assert ok(backend, "msg", "t", "0000000000000002", "--channel", "c")[1:] == [
        "channel  state   attempts  position  due  broker  client  key",
        "c        queued  0         1         -    -       -       b"]
    assert ok(backend, "msg", "t", "0000000000000005", "--channel", "c")[2] == \
        "c        queued  0         2         -    -       -       -"
    data = ok_json(backend, "msg", "t", "0000000000000006")
    [a4] = [w for w in store.ordering.waiting_in("t", "c") if w.id == b"0000000000000006"]
    assert data["channels"] == [
        {"channel": "c", "state": "waiting", "position": 3,
         "due_ms": a4.due_ms, "timestamp": data["timestamp"],
         "attempts": 0, "key": "a"},
        {"channel": "plain", "state": "deferred", "due_ms": data["channels"][1]["due_ms"],
         "timestamp": data["timestamp"], "attempts": 0}]
    assert data["body_base64"] == "YTQ="


def test_msg_delete_of_a_waiting_message(keyed, backend):
    store = keyed
    assert ok(backend, "msg", "t", "0000000000000003", "--channel", "c", "--delete") == [
        "deleted message 0000000000000003 from t/c (waiting behind order key a at "
        "position 1)"]
    assert ok_json(backend, "msg", "t", "0000000000000006", "--channel", "c",
                   "--delete") == {"topic": "t", "channel": "c", "id": "0000000000000006",
                                   "deleted": "waiting"}
    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=4, message_count=6, deleted_count=2, client_count=1, ordered=True,
        order_keys_out=2, order_waiting=1)
    assert ok(backend, "msg", "t", "0000000000000004", "--channel", "c")[2] == \
        "c        waiting  0         1         -    -       -       a"   # next behind a1
    result = run(backend, "msg", "t", "0000000000000003", "--channel", "c", "--delete")
    assert (result.exit_code, result.output) == (1, (
        "relay-admin: message 0000000000000003 is not queued, deferred or waiting on t/c: "
        "nothing deleted\n"))
    assert ok(backend, "msg", "t", "0000000000000001", "--channel", "c", "--delete") == [
        "deleted message 0000000000000001 from t/c (queued at position 1)"]
    assert ok(backend, "msg", "t", "0000000000000004", "--channel", "c")[2] == \
        "c        queued  0         3         -    -       -       a"   # a3 out: a's next
    assert order_figures(store.reads.read_channel("t", "c")) == (True, 2, 0)
    assert store.reads.read_channel("t", "plain")["depth"] == 5              # untouched


@pytest.mark.integration
@pytest.mark.cluster
def test_a_brokers_stats_and_metrics_show_an_ordered_channel(processes):
    from prometheus_client.parser import text_string_to_metric_families
    _, port = processes.broker()
    api = Api(port, processes.http_ports[port])
    assert api.request("POST", "/channel/order?topic=t&channel=c")[0] == 200
    assert api.request("POST", "/channel/create?topic=t&channel=plain")[0] == 200
    for key, body in [("a", b"a1"), ("b", b"b1"), ("a", b"a2"), ("a", b"a3")]:
        assert api.request("POST", f"/pub?topic=t&key={key}", body)[:2] == (200, b"OK")
    assert api.request("POST", "/pub?topic=t", b"u1")[:2] == (200, b"OK")
    status, data = api.json("GET", "/stats?format=json&topic=t")
    assert status == 200
    [topic] = data["topics"]
    assert [(c["channel_name"], c["depth"], order_figures(c)) for c in topic["channels"]] == [
        ("c", 5, (True, 2, 2)), ("plain", 5, (False, 0, 0))]
    status, text, _ = api.request("GET", "/stats?topic=t")     # nsqd's text: as it was
    assert b"[c                        ] depth: 5     be-depth: 5     inflt: 0    def: 0" \
        in text
    status, body, _ = api.request("GET", "/metrics")
    assert status == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(body.decode())
               for s in family.samples if s.name.startswith("relay_channel_")}
    c, plain = (("channel", "c"), ("topic", "t")), (("channel", "plain"), ("topic", "t"))
    assert [(name, labels, value) for (name, labels), value in sorted(samples.items())
            if "order" in name] == [
        ("relay_channel_order_keys_out", c, 2.0), ("relay_channel_order_waiting", c, 2.0),
        ("relay_channel_ordered", c, 1.0), ("relay_channel_ordered", plain, 0.0)]
    assert (samples[("relay_channel_depth", c)], samples[("relay_channel_depth", plain)]) == \
        (5, 5)
