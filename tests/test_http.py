"""nsqd's HTTP API against a real broker process, with a real HTTP client (http.client)."""

import http.client
import json
import re
import socket
import struct

import pytest

from relay.store import Store, codes
from relay.store.connection import connect
from tests.helpers.api import Api
from tests.helpers.pynsq import run_pynsq_client
from tests.helpers.servers import wake_listeners
from tests.helpers.wait import wait_for
from tests.helpers.wire import FRAME_RESPONSE, Wire

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out


@pytest.fixture
def api(processes):
    _, port = processes.broker("--max-msg-size", "100", "--max-body-size", "1000")
    processes.scanner()
    return Api(port, processes.http_ports[port])


def test_ping_and_info(api):
    status, body, headers = api.request("GET", "/ping")
    assert (status, body) == (200, b"OK")
    status, info = api.json("GET", "/info")
    assert status == 200
    assert info["version"] == "1.3.0"
    assert info["tcp_port"] == api.tcp_port
    assert info["http_port"] == api.http_port
    assert info["hostname"] == socket.gethostname()
    assert set(info) == {"version", "broadcast_address", "hostname", "http_port", "tcp_port",
                         "start_time", "max_heartbeat_interval", "max_output_buffer_size",
                         "max_output_buffer_timeout", "max_deflate_level"}


def test_pub_and_mpub_reach_consumers(api):
    api.request("POST", "/channel/create?topic=t&channel=c")
    assert api.request("POST", "/topic/create?topic=t")[:2] == (200, b"")
    assert api.request("POST", "/channel/create?topic=t&channel=c")[:2] == (200, b"")
    assert api.request("POST", "/pub?topic=t", b"one")[:2] == (200, b"OK")
    assert api.request("POST", "/mpub?topic=t", b"two\nthree\n\nfour")[:2] == (200, b"OK")
    binary = struct.pack(">i", 2) + struct.pack(">i", 4) + b"five" + struct.pack(">i", 3) + b"six"
    assert api.request("POST", "/mpub?topic=t&binary=true", binary)[:2] == (200, b"OK")
    assert sorted(api.consume("t", 6)) == sorted(
        [b"one", b"two", b"three", b"four", b"five", b"six"])


def test_deferred_pub_is_deferred(api):
    api.request("POST", "/channel/create?topic=t&channel=c")
    api.request("POST", "/topic/create?topic=t")
    api.request("POST", "/channel/create?topic=t&channel=c")
    assert api.request("POST", "/pub?topic=t&defer=60000", b"later")[:2] == (200, b"OK")
    status, stats = api.json("GET", "/stats?format=json&topic=t")
    assert stats["topics"][0]["channels"][0]["deferred_count"] == 1
    assert stats["topics"][0]["channels"][0]["depth"] == 0


@pytest.mark.parametrize("method,path,body,code,message", [
    ("POST", "/pub", b"x", 400, "MISSING_ARG_TOPIC"),
    ("POST", "/pub?topic=bad!name", b"x", 400, "INVALID_TOPIC"),
    ("POST", "/pub?topic=t", b"", 400, "MSG_EMPTY"),
    ("POST", "/pub?topic=t", b"x" * 101, 413, "MSG_TOO_BIG"),
    ("POST", "/pub?topic=t&defer=soon", b"x", 400, "INVALID_DEFER"),
    ("POST", "/pub?topic=t&defer=-1", b"x", 400, "INVALID_DEFER"),
    ("POST", "/pub?topic=t&defer=%205", b"x", 400, "INVALID_DEFER"),
    ("POST", "/pub?topic=t&defer=1_000", b"x", 400, "INVALID_DEFER"),
    ("POST", "/pub?topic=t&defer=%D9%A5", b"x", 400, "INVALID_DEFER"),   # Arabic-Indic 5
    ("POST", "/mpub?topic=t", b"x" * 1001, 413, "BODY_TOO_BIG"),
    ("POST", "/mpub?topic=t", b"ok\n" + b"x" * 101, 413, "MSG_TOO_BIG"),
    ("POST", "/mpub?topic=t&binary=1", struct.pack(">i", 0), 413, "BAD_BODY"),
    ("POST", "/mpub?topic=t&binary=1", struct.pack(">ii", 1, 101) + b"x" * 101, 413,
     "BAD_MESSAGE"),
    ("POST", "/channel/create?topic=t", None, 400, "MISSING_ARG_CHANNEL"),
    ("POST", "/channel/create?topic=t&channel=a%20b", None, 400, "INVALID_ARG_CHANNEL"),
    ("POST", "/channel/create?topic=nope&channel=c", None, 404, "TOPIC_NOT_FOUND"),
    ("POST", "/topic/create?topic=", None, 400, "INVALID_TOPIC"),
    ("GET", "/pub?topic=t", None, 405, "METHOD_NOT_ALLOWED"),
    ("POST", "/stats", None, 405, "METHOD_NOT_ALLOWED"),
    ("GET", "/nothing/here", None, 404, "NOT_FOUND"),
])
@pytest.mark.reuse_processes     # one broker for its cases (tests/helpers/reuse.py)
def test_errors_as_nsqd(api, method, path, body, code, message):
    status, data = api.json(method, path, body)
    assert (status, data) == (code, {"message": message})


def test_defer_takes_a_sign_as_go_parseint_does(api):
    assert api.request("POST", "/pub?topic=t&defer=%2B5", b"x")[:2] == (200, b"OK")


def test_head_options_and_allow_as_nsqds_router(api):
    """HEAD gets no body (a keep-alive client would read it as the next response's
    start); 405 names the methods allowed; OPTIONS answers 200 with them."""
    conn = http.client.HTTPConnection("127.0.0.1", api.http_port, timeout=5)
    conn.request("HEAD", "/ping")
    head = conn.getresponse()
    assert (head.status, head.read(), head.getheader("Allow")) == (405, b"", "GET, OPTIONS")
    conn.request("GET", "/ping")      # the same connection: nothing left over from HEAD
    ping = conn.getresponse()
    assert (ping.status, ping.read()) == (200, b"OK")
    conn.close()
    status, data, headers = api.request("GET", "/pub?topic=t")
    assert (status, headers["Allow"]) == (405, "OPTIONS, POST")
    status, data, headers = api.request("OPTIONS", "/pub?topic=t")
    assert (status, data, headers["Allow"]) == (200, b"", "OPTIONS, POST")
    status, data, headers = api.request("OPTIONS", "/config/log_level")
    assert (status, headers["Allow"]) == (200, "GET, OPTIONS, PUT")
    assert api.request("OPTIONS", "/nothing/here")[0] == 404
    assert "Allow" not in api.request("GET", "/ping")[2]


def test_error_publishes_nothing(api):
    api.request("POST", "/topic/create?topic=t")
    api.request("POST", "/channel/create?topic=t&channel=c")
    api.request("POST", "/mpub?topic=t", b"ok\n" + b"x" * 101)
    status, stats = api.json("GET", "/stats?format=json&topic=t")
    assert stats["topics"][0]["message_count"] == 0


@pytest.mark.parametrize("path,body,code,message", [
    ("/mpub?topic=made&binary=1", b"", 413, "BAD_BODY"),
    ("/mpub?topic=made&binary=1", struct.pack(">ii", 1, 0), 413, "BAD_MESSAGE"),
    ("/mpub?topic=made&binary=1", struct.pack(">ii", 1, 101) + b"x" * 101, 413, "BAD_MESSAGE"),
    ("/mpub?topic=made", b"ok\n" + b"x" * 101, 413, "MSG_TOO_BIG"),
    ("/mpub?topic=made", b"\n\n", 200, None),
    ("/pub?topic=made&defer=soon", b"x", 400, "INVALID_DEFER"),
])
def test_rejected_publish_creates_the_topic_as_nsqd(api, path, body, code, message):
    """nsqd gets the topic before it reads the body (/mpub) or the defer (/pub)."""
    status, data, _ = api.request("POST", path, body)
    assert (status, data if message is None else json.loads(data)) == (
        code, b"OK" if message is None else {"message": message})
    assert [(t["topic_name"], t["message_count"], t["depth"]) for t in _stats(api, "made")] == [
        ("made", 0, 0)]


@pytest.mark.parametrize("path,body", [
    ("/pub?topic=unmade", b""),
    ("/pub?topic=unmade", b"x" * 101),
    ("/mpub?topic=unmade", b"x" * 1001),
])
@pytest.mark.reuse_processes     # one broker for its cases (tests/helpers/reuse.py)
def test_publish_rejected_before_the_topic_leaves_none(api, path, body):
    """nsqd checks /pub's body and /mpub's Content-Length before it gets the topic."""
    assert api.request("POST", path, body)[0] in (400, 413)
    assert _stats(api, "unmade") == []


def test_oversized_declared_body_is_refused_before_it_is_sent(api):
    conn = http.client.HTTPConnection("127.0.0.1", api.http_port, timeout=5)
    conn.putrequest("POST", "/pub?topic=t")
    conn.putheader("Content-Length", str(4 * 1024 ** 3))
    conn.endheaders()
    resp = conn.getresponse()
    assert (resp.status, json.loads(resp.read())) == (413, {"message": "MSG_TOO_BIG"})
    conn.close()


def test_stats_json_has_nsqd_fields_and_this_brokers_clients(api):
    api.request("POST", "/mpub?topic=t", b"a\nb\nc")
    wire = Wire(api.tcp_port)
    wire.identify(client_id="worker-1", hostname="h1", user_agent="test/1.0")
    wire.sub("t", "c", rdy=1)
    wire.message()
    status, stats = api.json("GET", "/stats?format=json")
    assert status == 200
    assert set(stats) == {"version", "health", "start_time", "topics", "producers"}
    assert stats["health"] == "OK"
    [topic] = stats["topics"]
    assert set(topic) >= {"topic_name", "channels", "depth", "backend_depth", "message_count",
                          "message_bytes", "paused", "e2e_processing_latency"}
    [channel] = topic["channels"]
    assert set(channel) >= {"channel_name", "depth", "backend_depth", "in_flight_count",
                            "deferred_count", "message_count", "requeue_count",
                            "timeout_count", "client_count", "clients", "paused",
                            "e2e_processing_latency"}
    assert (channel["depth"], channel["in_flight_count"], channel["message_count"]) == (2, 1, 3)
    [client] = channel["clients"]
    assert (client["client_id"], client["hostname"], client["user_agent"]) == (
        "worker-1", "h1", "test/1.0")
    assert (client["ready_count"], client["in_flight_count"], client["state"]) == (1, 1, 3)
    status, stats = api.json("GET", "/stats?format=json&include_clients=false")
    assert stats["topics"][0]["channels"][0]["clients"] == []
    status, stats = api.json("GET", "/stats?format=json&topic=other")
    assert stats["topics"] == []
    status, stats = api.json("GET", "/stats?format=json&topic=t&channel=zzz")
    assert stats["topics"][0]["channels"] == []
    status, text, _ = api.request("GET", "/stats")
    assert status == 200
    assert b"Health: OK" in text
    assert b"[t              ] depth: 0     be-depth: 0     msgs: 3" in text
    wire.close()


@pytest.mark.parametrize("path,value", [
    ("/config/msg_timeout", 60_000_000_000),
    ("/config/max_msg_size", 100),
    ("/config/max_rdy_count", 2500),
])
@pytest.mark.reuse_processes     # one broker for its cases (tests/helpers/reuse.py)
def test_config_get_as_nsqd(api, path, value):
    status, data, _ = api.request("GET", path)
    assert (status, json.loads(data)) == (200, value)


@pytest.mark.parametrize("method,path,code,message", [
    ("GET", "/config/no_such_option", 400, "INVALID_OPTION"),
    ("GET", "/config/redis_url", 400, "INVALID_OPTION"),
    ("POST", "/config/msg_timeout", 405, "METHOD_NOT_ALLOWED"),
])
@pytest.mark.reuse_processes     # one broker for its cases (tests/helpers/reuse.py)
def test_config_errors(api, method, path, code, message):
    assert api.json(method, path) == (code, {"message": message})


def _stats(api, topic):
    status, stats = api.json("GET", f"/stats?format=json&topic={topic}")
    return stats["topics"]


def test_channel_empty_drops_ready_in_flight_and_deferred(api):
    api.request("POST", "/topic/create?topic=t")
    api.request("POST", "/channel/create?topic=t&channel=c")
    api.request("POST", "/channel/create?topic=t&channel=other")
    api.request("POST", "/mpub?topic=t", b"a\nb\nc")
    api.request("POST", "/pub?topic=t&defer=60000", b"d")
    wire = Wire(api.tcp_port)
    wire.identify()
    wire.sub("t", "c", rdy=1)
    msg_id = wire.message()[2]
    assert api.request("POST", "/channel/empty?topic=t&channel=c")[:2] == (200, b"")
    [topic] = _stats(api, "t")
    by_name = {c["channel_name"]: c for c in topic["channels"]}
    assert [by_name["c"][k] for k in ("depth", "in_flight_count", "deferred_count")] == [0, 0, 0]
    assert [by_name["other"][k] for k in ("depth", "deferred_count")] == [3, 1]
    wire.command(b"FIN " + msg_id)
    assert wire.frame()[1].startswith(b"E_FIN_FAILED")
    assert api.request("POST", "/pub?topic=t", b"after")[:2] == (200, b"OK")
    wire.command("RDY 1")
    assert wire.message()[3] == b"after"
    wire.close()


def test_topic_empty_drops_only_the_backlog(api):
    api.request("POST", "/mpub?topic=t", b"a\nb")
    assert _stats(api, "t")[0]["depth"] == 2
    assert api.request("POST", "/topic/empty?topic=t")[:2] == (200, b"")
    assert _stats(api, "t")[0]["depth"] == 0


def test_channel_and_topic_delete(api):
    api.request("POST", "/topic/create?topic=t")
    api.request("POST", "/channel/create?topic=t&channel=c")
    api.request("POST", "/channel/create?topic=t&channel=d")
    api.request("POST", "/mpub?topic=t", b"a\nb")
    assert api.request("POST", "/channel/delete?topic=t&channel=c")[:2] == (200, b"")
    assert [c["channel_name"] for c in _stats(api, "t")[0]["channels"]] == ["d"]
    assert api.json("POST", "/channel/delete?topic=t&channel=c") == (
        404, {"message": "CHANNEL_NOT_FOUND"})
    assert api.request("POST", "/topic/delete?topic=t")[:2] == (200, b"")
    assert _stats(api, "t") == []
    assert api.json("POST", "/topic/delete?topic=t") == (404, {"message": "TOPIC_NOT_FOUND"})
    api.request("POST", "/channel/create?topic=t&channel=c")
    api.request("POST", "/topic/create?topic=t")
    api.request("POST", "/channel/create?topic=t&channel=c")
    [topic] = _stats(api, "t")
    assert (topic["message_count"], topic["channels"][0]["depth"]) == (0, 0)


@pytest.mark.parametrize("path,code,message", [
    ("/topic/delete", 400, "MISSING_ARG_TOPIC"),
    ("/topic/empty?topic=nope", 404, "TOPIC_NOT_FOUND"),
    ("/topic/empty?topic=b@d", 400, "INVALID_TOPIC"),
    ("/channel/empty?topic=nope&channel=c", 404, "TOPIC_NOT_FOUND"),
    ("/channel/delete?topic=t", 400, "MISSING_ARG_CHANNEL"),
    ("/channel/delete?channel=c", 400, "MISSING_ARG_TOPIC"),
])
@pytest.mark.reuse_processes     # one broker for its cases (tests/helpers/reuse.py)
def test_delete_and_empty_errors(api, path, code, message):
    assert api.json("POST", path) == (code, {"message": message})


def test_channel_pause_holds_delivery_for_a_real_consumer(api):
    api.request("POST", "/topic/create?topic=t")
    api.request("POST", "/channel/create?topic=t&channel=c")
    assert api.request("POST", "/channel/pause?topic=t&channel=c")[:2] == (200, b"")
    wire = Wire(api.tcp_port)
    wire.identify()
    wire.sub("t", "c", rdy=10)
    api.request("POST", "/pub?topic=t", b"held")
    assert wire.nothing(wait=0.5)
    channel = _stats(api, "t")[0]["channels"][0]
    assert (channel["paused"], channel["depth"]) == (True, 1)
    assert api.request("POST", "/channel/unpause?topic=t&channel=c")[:2] == (200, b"")
    assert wire.message()[3] == b"held"
    assert _stats(api, "t")[0]["channels"][0]["paused"] is False
    assert api.json("POST", "/channel/pause?topic=t&channel=zz") == (
        404, {"message": "CHANNEL_NOT_FOUND"})
    wire.close()


def test_topic_pause_holds_fan_out_for_a_real_consumer(api):
    api.request("POST", "/topic/create?topic=t")
    api.request("POST", "/channel/create?topic=t&channel=c")
    assert api.request("POST", "/topic/pause?topic=t")[:2] == (200, b"")
    wire = Wire(api.tcp_port)
    wire.identify()
    wire.sub("t", "c", rdy=10)
    api.request("POST", "/mpub?topic=t", b"one\ntwo")
    assert wire.nothing(wait=0.5)
    [topic] = _stats(api, "t")
    assert (topic["paused"], topic["depth"], topic["channels"][0]["depth"]) == (True, 2, 0)
    assert api.request("POST", "/topic/unpause?topic=t")[:2] == (200, b"")
    assert sorted([wire.message()[3], wire.message()[3]]) == [b"one", b"two"]
    assert _stats(api, "t")[0]["paused"] is False
    assert api.json("POST", "/topic/pause?topic=nope") == (404, {"message": "TOPIC_NOT_FOUND"})
    assert api.json("POST", "/topic/pause") == (400, {"message": "MISSING_ARG_TOPIC"})
    wire.close()


def test_an_unpause_cut_short_is_finished_by_the_next_sub(processes, redis_url):
    """An unpause whose caller died after its first step (pause_topic.lua) leaves the
    topic `unpausing` with the rest of its backlog; a consumer's SUB finds it so and
    its broker runs the steps left: the consumer gets all 25,000, in publish order."""
    store = Store(connect(redis_url))
    store.subscribe("t", "c", "")
    store.control.pause_topic("t", True)
    for start in range(0, 25_000, 1_000):
        store.publish("t", [b"%05d" % i for i in range(start, start + 1_000)])
    assert store.run(store.pause_topic_op("t", "0")) == codes.MORE
    assert store.reads.read_channel("t", "c")["depth"] == 10_000
    _, port = processes.broker()
    consumer = Wire(port)
    consumer.identify()
    assert consumer.sub("t", "c", rdy=2500) == (FRAME_RESPONSE, b"OK")
    got = consumer.finish_next(25_000)
    assert consumer.nothing()
    assert got == [b"%05d" % i for i in range(25_000)]
    assert store.reads.read_topic("t")["paused"] is False
    consumer.close()


def test_lookup_endpoints_list_live_brokers(processes):
    _, port1 = processes.broker("--broadcast-address", "127.0.0.1")
    _, port2 = processes.broker("--broadcast-address", "127.0.0.1")
    api = Api(port1, processes.http_ports[port1])
    api.request("POST", "/topic/create?topic=t")
    api.request("POST", "/channel/create?topic=t&channel=c")
    assert api.json("GET", "/topics") == (200, {"topics": ["t"]})
    assert api.json("GET", "/channels?topic=t") == (200, {"channels": ["c"]})
    status, data = api.json("GET", "/lookup?topic=t")
    assert status == 200
    assert data["channels"] == ["c"]
    assert sorted((p["tcp_port"], p["http_port"]) for p in data["producers"]) == sorted(
        [(port1, processes.http_ports[port1]), (port2, processes.http_ports[port2])])
    assert {p["broadcast_address"] for p in data["producers"]} == {"127.0.0.1"}
    assert set(data["producers"][0]) == {"remote_address", "hostname", "broadcast_address",
                                         "tcp_port", "http_port", "version"}
    status, nodes = api.json("GET", "/nodes")
    assert [n["topics"] for n in nodes["producers"]] == [["t"], ["t"]]
    assert [n["tombstones"] for n in nodes["producers"]] == [[False], [False]]
    assert api.json("GET", "/lookup?topic=nope") == (404, {"message": "TOPIC_NOT_FOUND"})
    assert api.json("GET", "/lookup") == (400, {"message": "MISSING_ARG_TOPIC"})


def test_stopped_broker_leaves_the_registry(processes):
    proc, port1 = processes.broker("--broadcast-address", "127.0.0.1")
    _, port2 = processes.broker("--broadcast-address", "127.0.0.1")
    api = Api(port2, processes.http_ports[port2])
    api.request("POST", "/topic/create?topic=t")
    assert len(api.json("GET", "/lookup?topic=t")[1]["producers"]) == 2
    proc.terminate()
    proc.wait(10)
    assert [p["tcp_port"] for p in api.json("GET", "/lookup?topic=t")[1]["producers"]] == [port2]


def test_pynsq_reader_with_only_a_lookupd_address_finds_both_brokers(processes):
    _, port1 = processes.broker("--broadcast-address", "127.0.0.1")
    _, port2 = processes.broker("--broadcast-address", "127.0.0.1")
    processes.scanner()
    api = Api(port1, processes.http_ports[port1])
    bodies = [f"m{i}" for i in range(20)]
    assert api.request("POST", "/mpub?topic=t", "\n".join(bodies).encode())[:2] == (200, b"OK")
    [result] = run_pynsq_client("lookup", processes.http_ports[port1], "t", "c", 20)
    assert result["bodies"] == sorted(bodies)
    assert result["connections"] == sorted([f"127.0.0.1:{port1}", f"127.0.0.1:{port2}"])


def test_metrics_parse_with_prometheus_client(api):
    from prometheus_client.parser import text_string_to_metric_families
    api.request("POST", "/topic/create?topic=t")
    api.request("POST", "/channel/create?topic=t&channel=c")
    api.request("POST", "/mpub?topic=t", b"a\nb\nc")
    wire = Wire(api.tcp_port)
    wire.identify()
    wire.sub("t", "c", rdy=1)
    wire.message()
    status, body, headers = api.request("GET", "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(body.decode())
               for s in family.samples}
    tc = (("channel", "c"), ("topic", "t"))
    assert samples[("relay_channel_depth", tc)] == 2
    assert samples[("relay_channel_in_flight", tc)] == 1
    assert samples[("relay_channel_messages_total", tc)] == 3
    assert samples[("relay_channel_consumers", tc)] == 1
    assert samples[("relay_channel_deleted_total", tc)] == 0
    assert samples[("relay_topic_messages_total", (("topic", "t"),))] == 3
    assert samples[("relay_published_messages_total", ())] == 3
    assert samples[("relay_delivered_messages_total", ())] == 1
    assert samples[("relay_clients", ())] == 1
    assert samples[("relay_redis_round_trip_seconds_count", ())] > 0
    assert samples[("relay_uptime_seconds", ())] > 0
    wire.close()


def test_separate_lookupd_port_answers_as_nsqlookupd(processes):
    _, port = processes.broker("--broadcast-address", "127.0.0.1")
    lookupd = Api(port, processes.lookupd_ports[port])
    assert lookupd.request("GET", "/ping")[:2] == (200, b"OK")
    assert lookupd.json("GET", "/info") == (200, {"version": "1.3.0"})
    assert lookupd.request("POST", "/channel/create?topic=t&channel=c")[:2] == (200, b"")
    status, data = lookupd.json("GET", "/lookup?topic=t")
    assert (data["channels"], [p["tcp_port"] for p in data["producers"]]) == (["c"], [port])
    assert lookupd.json("POST", "/channel/delete?topic=t&channel=zz") == (
        404, {"message": "CHANNEL_NOT_FOUND"})
    assert lookupd.request("POST", "/topic/delete?topic=t")[:2] == (200, b"")
    assert lookupd.request("POST", "/topic/delete?topic=t")[:2] == (200, b"")
    assert lookupd.json("GET", "/topics") == (200, {"topics": ["t"]})  # as nsqlookupd: no data
    assert lookupd.json("POST", "/pub?topic=t", b"x") == (404, {"message": "NOT_FOUND"})


def test_deleting_a_channel_or_topic_closes_its_consumers(api, processes):
    assert api.request("POST", "/topic/create?topic=t")[0] == 200
    consumers = {}
    for channel in ("gone", "stays"):
        wire = Wire(api.tcp_port)
        wire.identify()
        assert wire.sub("t", channel, rdy=1) == (FRAME_RESPONSE, b"OK")
        consumers[channel] = wire
    assert wait_for(lambda: wake_listeners(processes.redis_url, "t") == 1)
    assert api.request("POST", "/channel/delete?topic=t&channel=gone")[:2] == (200, b"")
    assert consumers["gone"].closed(timeout=3)
    assert not consumers["stays"].closed(timeout=0.5)
    assert api.request("POST", "/topic/delete?topic=t")[:2] == (200, b"")
    assert consumers["stays"].closed(timeout=3)


def test_stats_list_this_brokers_producers_with_their_pub_counts(api):
    producer = Wire(api.tcp_port)
    producer.identify(client_id="loader", hostname="h2", user_agent="test/2.0")
    assert producer.pub("a", b"1") == (FRAME_RESPONSE, b"OK")
    assert producer.mpub("b", [b"1", b"2"]) == (FRAME_RESPONSE, b"OK")
    status, stats = api.json("GET", "/stats?format=json")
    [p] = stats["producers"]
    assert (p["client_id"], p["hostname"], p["user_agent"], p["state"], p["pub_counts"]) == (
        "loader", "h2", "test/2.0", 0, [{"topic": "a", "count": 1}, {"topic": "b", "count": 2}])
    status, text, _ = api.request("GET", "/stats")
    assert re.search(
        r"Producers:\n"
        r"   \[V2 loader               \] msgs: 3        connected: \d+s\n"
        r"      \[a              \] msgs: 1       \n"
        r"      \[b              \] msgs: 2       \n$", text.decode())
    assert api.json("GET", "/stats?format=json&include_clients=false")[1]["producers"] == []
    producer.close()


def test_put_config_log_level_changes_it_at_run_time(api, processes):
    assert api.json("GET", "/config/log_level") == (200, "info")
    assert api.json("PUT", "/config/log_level", b"debug") == (200, "debug")
    assert api.json("GET", "/config/log_level") == (200, "debug")
    Wire(api.tcp_port).close()
    assert wait_for(lambda: "level=debug" in processes.logs())
    assert api.json("PUT", "/config/log_level", b"loud") == (400, {"message": "INVALID_VALUE"})
    assert api.json("PUT", "/config/log_level", b"") == (413, {"message": "INVALID_VALUE"})
    assert api.json("PUT", "/config/msg_timeout", b"1000") == (
        400, {"message": "INVALID_OPTION"})
    assert api.json("PUT", "/config/log_level", b"warn") == (200, "warning")
    assert api.json("PUT", "/config/log_level", b"FATAL") == (200, "fatal")
