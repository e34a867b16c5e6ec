"""How a user asks for ordered delivery (relay/store/ordering.py): order keys over HTTP
(key=, ordered=true, with publish keys too), over TCP after IDENTIFY relay_order, from a
topic's rule for stock clients, and relay-admin order, order-key and pub --key; bad keys
refused with nothing published. Real brokers; relay-admin through click on the test
backend."""

import json

import pytest

from relay.codec import FRAME_ERROR, FRAME_RESPONSE
from tests.helpers import gnsq_clients
from tests.helpers.admin import ok, ok_json, relay_admin, run
from tests.helpers.api import Api
from tests.helpers.wait import wait_for
from tests.helpers.wire import Wire, mpub_body


@pytest.fixture
def api(processes):
    _, port = processes.broker()
    processes.scanner()
    return Api(port, processes.http_ports[port])


def ordered_on(api, topic="t", channel="c"):
    status, data, _ = api.request("POST", f"/channel/order?topic={topic}&channel={channel}")
    assert (status, json.loads(data)["ordered"]) == (200, True)


def consumer(api, topic="t", channel="c", rdy=10) -> Wire:
    wire = Wire(api.tcp_port)
    wire.identify()
    assert wire.sub(topic, channel, rdy=rdy) == (FRAME_RESPONSE, b"OK")
    return wire


def take(wire, n) -> list:
    """(id, body) of the next `n` messages, and then none more for 0.3 s."""
    got = [wire.message() for _ in range(n)]
    assert wire.nothing(0.3)
    return [(m[2], m[3]) for m in got]


def finish(wire, taken, body):
    [msg_id] = [i for i, b in taken if b == body]
    taken.remove((msg_id, body))
    wire.command(b"FIN " + msg_id)


def drain_in_order(wire, n) -> list:
    """The bodies of the next `n` messages, each FINished as it comes (what a consumer
    that waits for each key's next one sees), and then none more for 0.3 s."""
    seen = []
    for _ in range(n):
        _, _, msg_id, body = wire.message()
        seen.append(body)
        wire.command(b"FIN " + msg_id)
    assert wire.nothing(0.3)
    return seen


@pytest.mark.integration
@pytest.mark.cluster
def test_http_order_keys_one_at_a_time_per_key(api):
    ordered_on(api)
    assert api.request("POST", "/pub?topic=t&key=acct-1", b"a1")[:2] == (200, b"OK")
    assert api.request("POST", "/mpub?topic=t&key=acct-1", b"a2\na3\n")[:2] == (200, b"OK")
    assert api.request("POST", "/mpub?topic=t&ordered=true",
                       b"acct-2 b1\nacct-1 a4\nacct-2 b2 with spaces\n")[:2] == (200, b"OK")
    assert api.request("POST", "/pub?topic=t", b"plain")[:2] == (200, b"OK")
    wire = consumer(api)
    first = take(wire, 3)
    assert sorted(body for _, body in first) == [b"a1", b"b1", b"plain"]
    finish(wire, first, b"a1")
    second = take(wire, 1)
    assert [body for _, body in second] == [b"a2"]
    for msg_id, body in first + second:
        wire.command(b"FIN " + msg_id)
    seen = drain_in_order(wire, 3)
    assert [b for b in seen if b.startswith(b"a")] == [b"a3", b"a4"]
    assert [b for b in seen if b.startswith(b"b")] == [b"b2 with spaces"]


@pytest.mark.integration
def test_http_publish_keys_and_order_keys_together(api, redis_url):
    ordered_on(api)
    assert api.request("POST", "/topic/dedup?topic=t&window=10m")[0] == 200
    body = b"id-1 k one\nid-2 k two\nid-1 k one again\n"
    status, data, headers = api.request("POST", "/mpub?topic=t&keyed=true&ordered=true", body)
    assert (status, data, headers["X-Relay-Duplicates"]) == (200, b"OK", "1")
    binary = mpub_body([b"id-3 k three"])
    status, data, headers = api.request(
        "POST", "/mpub?topic=t&keyed=true&ordered=true&binary=true", binary)
    assert (status, data, headers["X-Relay-Duplicates"]) == (200, b"OK", "0")
    assert drain_in_order(consumer(api), 3) == [b"one", b"two", b"three"]


@pytest.mark.integration
@pytest.mark.parametrize("path, body, error", [
    ("/pub?topic=t&key=", b"x", "KEY_EMPTY"),
    ("/pub?topic=t&key=" + "k" * 257, b"x", "KEY_TOO_LONG"),
    ("/pub?topic=t&key=a%20b", b"x", "KEY_NOT_TEXT"),
    ("/mpub?topic=t&key=%FF", b"x\n", "KEY_NOT_TEXT"),
    ("/mpub?topic=t&ordered=true", b"k1 fine\n no-key\n", "KEY_EMPTY"),
    ("/mpub?topic=t&ordered=true", b"k1 fine\nno-body\n", "MSG_EMPTY"),
    ("/mpub?topic=t&ordered=true&key=k", b"k1 fine\n", "INVALID_ARG_KEY"),
    ("/mpub?topic=t&keyed=true&ordered=true", b"id k fine\nid-2  body\n", "KEY_EMPTY")])
@pytest.mark.reuse_processes     # one broker for its cases (tests/helpers/reuse.py)
def test_a_bad_order_key_is_a_400_and_publishes_nothing(api, path, body, error):
    ordered_on(api)
    status, data, _ = api.request("POST", path, body)
    assert (status, json.loads(data)) == (400, {"message": error})
    _, stats = api.json("GET", "/stats?format=json&topic=t")
    assert stats["topics"][0]["message_count"] == 0


def opted_in(port, **fields) -> Wire:
    wire = Wire(port)
    frame_type, data = wire.identify(feature_negotiation=True, relay_order=True, **fields)
    answer = json.loads(data)
    assert (frame_type, answer["relay_order"], answer.get("relay_dedup")) == (
        FRAME_RESPONSE, True, fields.get("relay_dedup"))
    return wire


@pytest.mark.integration
@pytest.mark.cluster
def test_tcp_order_keys_after_identify_relay_order(api):
    ordered_on(api)
    wire = opted_in(api.tcp_port)
    assert wire.command("PUB t acct-1", b"a1").frame() == (FRAME_RESPONSE, b"OK")
    assert wire.command("DPUB t 0 acct-1", b"a2").frame() == (FRAME_RESPONSE, b"OK")
    assert wire.command("MPUB t ordered", mpub_body([b"acct-1 a3", b"acct-2 b1"])).frame() == (
        FRAME_RESPONSE, b"OK")
    assert wire.pub("t", b"plain") == (FRAME_RESPONSE, b"OK")
    both = opted_in(api.tcp_port, relay_dedup=True)
    assert both.command("PUB t id-9 acct-2", b"b2").frame() == (FRAME_RESPONSE, b"OK")
    assert both.command("MPUB t keyed+ordered", mpub_body([b"id-10 acct-2 b3"])).frame() == (
        FRAME_RESPONSE, b"OK")
    reader = consumer(api)
    first = take(reader, 3)
    assert sorted(body for _, body in first) == [b"a1", b"b1", b"plain"]
    for msg_id, _ in first:
        reader.command(b"FIN " + msg_id)
    seen = drain_in_order(reader, 4)
    assert [b for b in seen if b.startswith(b"a")] == [b"a2", b"a3"]
    assert [b for b in seen if b.startswith(b"b")] == [b"b2", b"b3"]


@pytest.mark.integration
@pytest.mark.parametrize("line, body, error", [
    ("PUB t " + "k" * 257, b"x", b"E_INVALID PUB invalid order key: KEY_TOO_LONG"),
    ("DPUB t 0 \x01", b"x", b"E_INVALID DPUB invalid order key: KEY_NOT_TEXT"),
    ("MPUB t keyed", mpub_body([b"k x"]), b"E_INVALID MPUB third parameter must be 'ordered'"),
    ("MPUB t ordered", mpub_body([b"k1 x", b" no"]), b"E_BAD_BODY MPUB message 2: KEY_EMPTY")])
@pytest.mark.reuse_processes     # one broker for its cases (tests/helpers/reuse.py)
def test_a_bad_tcp_order_key_is_an_error_and_publishes_nothing(api, line, body, error):
    ordered_on(api)
    wire = opted_in(api.tcp_port)
    wire.command(line.encode("latin-1"), body)
    assert wire.frame() == (FRAME_ERROR, error)
    assert wire.closed()
    _, stats = api.json("GET", "/stats?format=json&topic=t")
    assert stats["topics"][0]["message_count"] == 0


@pytest.mark.integration
def test_a_stock_client_gets_order_from_the_topics_rule(api):
    """gnsq publishes plain PUBs; the topic's rule reads each body's account."""
    ordered_on(api)
    status, data, _ = api.request("POST", "/topic/order-key?topic=t&json_field=account")
    assert (status, json.loads(data)) == (200, {"topic": "t", "order_key_rule": {
        "kind": "json-field", "value": "account"}})
    events = [{"account": f"acct-{n % 3}", "n": n} for n in range(12)]
    gnsq_clients.publish(api.tcp_port, "t", [json.dumps(e).encode() for e in events])
    wire = consumer(api)
    assert len(take(wire, 3)) == 3
    wire.close()
    seen = [json.loads(b) for b in drain_in_order(consumer(api), 12)]
    for account in ("acct-0", "acct-1", "acct-2"):
        assert [e["n"] for e in seen if e["account"] == account] == [
            e["n"] for e in events if e["account"] == account]


def test_relay_admin_order_turns_it_on_shows_and_off(store, backend):
    store.publish("t", [b"x"])
    assert ok(backend, "order", "t/c") == [
        "channel  ordered  keys_out  waiting  order_key_rule",
        "t/c      on       0         0        -"]
    store.dedup.publish_keyed("t", [b"1", b"2", b"3"], None, 0, [b"k", b"k", b"j"])
    assert ok_json(backend, "order", "t", "c", "--show") == {
        "topic": "t", "channel": "c", "ordered": True, "keys_out": 2, "waiting": 1,
        "order_key_rule": None}
    assert ok(backend, "order", "t/c", "--off") == [
        "channel  ordered  keys_out  waiting  order_key_rule",
        "t/c      off      0         0        -",
        "1 messages that waited behind their keys went out"]
    done = run(backend, "order", "t/nope", "--show")
    assert (done.exit_code, done.stderr) == (1, "relay-admin: channel t/nope not found\n")


def test_relay_admin_refuses_an_ordered_limited_channel(store, backend):
    store.ordering.set_ordered("t", "c", True)
    done = run(backend, "limit", "t/c", "--max-depth", "10")
    assert (done.exit_code, done.stderr) == (
        1, "relay-admin: channel t/c is ordered: turn that off first (relay-admin order "
           "--off), a depth limit and ordered delivery do not go together\n")
    store.control.create_channel("t", "d")
    ok(backend, "limit", "t/d", "--max-depth", "10")
    done = run(backend, "order", "t/d")
    assert (done.exit_code, done.stderr) == (
        1, "relay-admin: channel t/d has a depth limit: remove it first (relay-admin limit "
           "--off), ordered delivery and a depth limit do not go together\n")


def test_relay_admin_order_key_and_pub_key(store, backend):
    assert ok(backend, "order-key", "t", "--separator", ":") == [
        "t: order key rule separator ':'"]
    assert ok_json(backend, "order-key", "t") == {
        "topic": "t", "order_key_rule": {"kind": "separator", "value": ":"}}
    store.ordering.set_ordered("t", "c", True)
    ok(backend, "pub", "t", input="dev-1:a\ndev-2:b\ndev-1:c\n")
    ok(backend, "pub", "t", "--key", "dev-2", input="no separator\n")
    assert ok_json(backend, "order", "t/c", "--show")["waiting"] == 2
    assert ok(backend, "order-key", "t", "--off") == ["t: order key rule none"]
    done = run(backend, "order-key", "t", "--separator", ":", "--off")
    assert (done.exit_code, done.stderr) == (
        2, "relay-admin: --separator and --off do not go together "
           "(see relay-admin order-key --help)\n")
    done = run(backend, "pub", "t", "--key", "two words", input="x\n")
    assert (done.exit_code, done.stderr) == (
        2, "relay-admin: --key 'two words': KEY_NOT_TEXT: 1-256 bytes of text without spaces "
           "(see relay-admin pub --help)\n")


@pytest.mark.integration
def test_a_rule_set_later_reaches_brokers_that_know_the_topic(processes, redis_url):
    """Both brokers serve the topic (a consumer each: they follow its news every second,
    its partitions cached) before relay-admin sets the rule: setting it is news, so each
    uses it within a second or two."""
    apis = [Api(port, processes.http_ports[port])
            for port in (processes.broker()[1], processes.broker()[1])]
    ordered_on(apis[0])
    consumers = [consumer(api, rdy=0) for api in apis]
    for api in apis:
        assert api.request("POST", "/pub?topic=t", b"before")[:2] == (200, b"OK")
    done = relay_admin(redis_url, "order-key", "t", "--separator", ":")
    assert done.returncode == 0, done.stderr

    def waiting_after_publish() -> bool:
        assert apis[1].request("POST", "/mpub?topic=t", b"acct:1\nacct:2\n")[:2] == (200, b"OK")
        _, report = apis[1].json("GET", "/channel/order?topic=t&channel=c")
        return report["waiting"] > 0
    assert wait_for(waiting_after_publish, timeout=5, interval=0.5)
    for wire in consumers:
        wire.close()
