"""A client of nsqd's HTTP API (http.client), and a raw consumer to check what it did."""

import http.client
import json

from tests.helpers.wire import FRAME_RESPONSE, Wire


class Api:
    def __init__(self, tcp_port, http_port):
        self.tcp_port = tcp_port
        self.http_port = http_port

    def request(self, method, path, body=None, headers=None, timeout=5.0):
        """(status, body bytes, headers dict)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, data, dict(resp.getheaders())

    def json(self, method, path, body=None):
        status, data, headers = self.request(method, path, body)
        assert headers["Content-Type"] == "application/json; charset=utf-8"
        return status, json.loads(data)

    def consume(self, topic, n):
        wire = Wire(self.tcp_port)
        wire.identify()
        assert wire.sub(topic, "c", rdy=100) == (FRAME_RESPONSE, b"OK")
        bodies = [wire.message()[3] for _ in range(n)]
        assert wire.nothing()
        wire.close()
        return bodies


def client_count(http_port, topic, channel=None) -> int:
    """How many clients one broker has subscribed to `topic` (or one of its channels),
    from its /stats."""
    _, stats = Api(None, http_port).json("GET", f"/stats?format=json&topic={topic}")
    return sum(len(ch["clients"]) for t in stats["topics"] for ch in t["channels"]
               if channel in (None, ch["channel_name"]))
