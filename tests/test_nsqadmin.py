"""nsqadmin in lookupd mode (`nsqadmin --lookupd-http-address BROKER:LOOKUPD_PORT`):
each action makes the HTTP calls nsqadmin's clusterinfo (internal/clusterinfo/data.go)
makes, in its order, and collects the warnings nsqadmin would show."""

import json
import time

import pytest

from tests.helpers.api import Api
from tests.helpers.wire import FRAME_RESPONSE, Wire

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out


class Nsqadmin:
    """The calls of nsqadmin's DeleteTopic, DeleteChannel and TombstoneNodeForTopic
    against one lookupd; a reply other than 200 becomes nsqadmin's warning text."""

    def __init__(self, lookupd_port: int):
        self.lookupd = Api(None, lookupd_port)
        self.warnings: list[str] = []

    def _call(self, api: Api, method: str, path: str):
        status, body, _ = api.request(method, path)
        if status != 200:
            self.warnings.append(f"got response {status} {body.decode()!r}")
            return None
        return json.loads(body) if body else None

    def _producers(self, topic: str) -> list[Api]:
        """GetLookupdTopicProducers: /lookup's producers, one per HTTP address."""
        found = self._call(self.lookupd, "GET", f"/lookup?topic={topic}") or {"producers": []}
        ports = {(p["broadcast_address"], p["http_port"]) for p in found["producers"]}
        assert {host for host, _ in ports} <= {"127.0.0.1"}
        return [Api(None, port) for _, port in sorted(ports)]

    def delete_topic(self, topic: str) -> None:
        producers = self._producers(topic)
        self._call(self.lookupd, "POST", f"/topic/delete?topic={topic}")
        for nsqd in producers:
            self._call(nsqd, "POST", f"/topic/delete?topic={topic}")

    def delete_channel(self, topic: str, channel: str) -> None:
        producers = self._producers(topic)
        self._call(self.lookupd, "POST", f"/channel/delete?topic={topic}&channel={channel}")
        for nsqd in producers:
            self._call(nsqd, "POST", f"/channel/delete?topic={topic}&channel={channel}")

    def tombstone(self, topic: str, node_http_port: int) -> None:
        """The node is named by its HTTP address, as nsqadmin's topic page names it."""
        node = f"127.0.0.1:{node_http_port}"
        self._call(self.lookupd, "POST", f"/topic/tombstone?topic={topic}&node={node}")
        nsqd = Api(None, node_http_port)
        info = self._call(nsqd, "GET", "/info")
        self._call(nsqd, "GET", "/stats?format=json&include_clients=false")
        self._call(Api(None, info["http_port"]), "POST", f"/topic/delete?topic={topic}")


def brokers(processes, n: int, *args) -> list[Api]:
    """n brokers on 127.0.0.1; each Api on its nsqd HTTP port, .lookupd_port its own."""
    out = []
    for _ in range(n):
        _, port = processes.broker("--broadcast-address", "127.0.0.1", *args)
        api = Api(port, processes.http_ports[port])
        api.lookupd_port = processes.lookupd_ports[port]
        out.append(api)
    return out


def channels(api: Api, topic: str) -> list[str]:
    status, data = api.json("GET", f"/stats?format=json&topic={topic}")
    return [c["channel_name"] for t in data["topics"] for c in t["channels"]]


@pytest.mark.parametrize("n", [1, 2])
def test_deleting_a_channel_then_its_topic_answers_as_nsqd(processes, n):
    nodes = brokers(processes, n)
    first = nodes[0]
    for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c",
                 "/channel/create?topic=t&channel=d"):
        assert first.request("POST", path)[0] == 200
    first.request("POST", "/mpub?topic=t", b"a\nb")
    admin = Nsqadmin(nodes[-1].lookupd_port)

    admin.delete_channel("t", "c")
    assert admin.warnings == []
    assert [channels(api, "t") for api in nodes] == [["d"]] * n
    admin.delete_topic("t")
    assert admin.warnings == []
    assert [api.json("GET", "/topics")[1] for api in nodes] == [{"topics": []}] * n


def test_lookupd_delete_endpoints_only_answer_as_nsqlookupd(processes):
    [api] = brokers(processes, 1)
    lookupd = Api(None, api.lookupd_port)
    api.request("POST", "/topic/create?topic=t")
    api.request("POST", "/channel/create?topic=t&channel=c")
    api.request("POST", "/pub?topic=t", b"kept")
    assert lookupd.request("POST", "/channel/delete?topic=t&channel=c")[:2] == (200, b"")
    assert lookupd.request("POST", "/topic/delete?topic=t")[:2] == (200, b"")
    assert lookupd.request("POST", "/topic/delete?topic=never")[:2] == (200, b"")
    assert lookupd.json("POST", "/channel/delete?topic=t&channel=zz") == (
        404, {"message": "CHANNEL_NOT_FOUND"})
    assert lookupd.json("POST", "/topic/create?topic=b@d") == (
        400, {"message": "INVALID_ARG_TOPIC"})
    assert channels(api, "t") == ["c"]
    assert api.consume("t", 1) == [b"kept"]


def test_tombstoning_a_broker_leaves_it_out_of_lookup_on_every_broker_and_deletes_nothing(
        processes):
    one, two = brokers(processes, 2, "--tombstone-lifetime", "2s")
    one.request("POST", "/topic/create?topic=t")
    one.request("POST", "/channel/create?topic=t&channel=c")
    one.request("POST", "/mpub?topic=t", b"a\nb\nc")
    consumer = Wire(one.tcp_port)
    consumer.identify()
    assert consumer.sub("t", "c", rdy=1) == (FRAME_RESPONSE, b"OK")
    consumer.message()
    admin = Nsqadmin(two.lookupd_port)

    admin.tombstone("t", one.http_port)
    tombstoned = time.monotonic()
    assert admin.warnings == []
    assert consumer.closed()      # its consumers of t look up the other brokers
    for api in (Api(None, one.lookupd_port), Api(None, two.lookupd_port), one, two):
        status, found = api.json("GET", "/lookup?topic=t")
        assert [p["tcp_port"] for p in found["producers"]] == [two.tcp_port]
        status, nodes = api.json("GET", "/nodes")
        assert {n["tcp_port"]: n["tombstones"] for n in nodes["producers"]} == {
            one.tcp_port: [True], two.tcp_port: [False]}
    assert sorted(two.consume("t", 3)) == [b"a", b"b", b"c"]  # a requeued at the close

    while time.monotonic() - tombstoned < 2.5:
        time.sleep(0.1)
    status, found = two.json("GET", "/lookup?topic=t")
    assert sorted(p["tcp_port"] for p in found["producers"]) == sorted(
        [one.tcp_port, two.tcp_port])
    assert one.request("POST", "/topic/delete?topic=t")[:2] == (200, b"")  # nsqd's, again
    assert two.json("GET", "/topics") == (200, {"topics": []})


@pytest.mark.parametrize("path,code,message", [
    ("/topic/tombstone?node=127.0.0.1:4151", 400, "MISSING_ARG_TOPIC"),
    ("/topic/tombstone?topic=t", 400, "MISSING_ARG_NODE"),
])
def test_tombstone_errors_are_nsqlookupds(processes, path, code, message):
    [api] = brokers(processes, 1)
    lookupd = Api(None, api.lookupd_port)
    assert lookupd.json("POST", path) == (code, {"message": message})
    assert lookupd.json("GET", "/topic/tombstone?topic=t&node=x") == (
        405, {"message": "METHOD_NOT_ALLOWED"})
