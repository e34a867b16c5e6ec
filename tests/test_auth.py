"""AUTH against an auth server started by the test (nsqd's /auth contract), a static
auth file, and the HTTP API; every denial with nsqd's exact error."""

import hashlib
import http.client
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from relay.codec import FRAME_ERROR, FRAME_RESPONSE
from tests.helpers.api import Api
from tests.helpers.pynsq import run_pynsq_secure
from tests.helpers.tls import Secure, body_of, tls_broker
from tests.helpers.wait import wait_for
from tests.helpers.wire import Wire

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

GRANTS = {
    "pub-secret": {"ttl": 1, "identity": "producer", "identity_url": "http://ids/p",
                   "authorizations": [{"topic": "^orders$", "channels": [".*"],
                                       "permissions": ["publish"]}]},
    "sub-secret": {"ttl": 3600, "identity": "billing",
                   "authorizations": [{"topic": "^orders$", "channels": ["^billing"],
                                       "permissions": ["subscribe"]}]},
    "both-secret": {"ttl": 3600, "authorizations": [{"topic": ".*", "channels": [".*"],
                                                     "permissions": ["subscribe", "publish"]}]},
    "nothing": {"ttl": 3600, "authorizations": []},
}
# a secret the auth server grants only to clients from one address
PINNED = {"pinned-secret": "127.0.0.2"}


class AuthServer(ThreadingHTTPServer):
    """nsqd's auth server contract: GET /auth?remote_ip=&tls=&secret=&common_name=."""

    def __init__(self):
        self.asked: Counter = Counter()
        self.queries: list = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(handler):
                query = {k: v[0] for k, v in parse_qs(urlparse(handler.path).query).items()}
                self.queries.append(query)
                secret = query.get("secret", "")
                self.asked[secret] += 1
                if secret in PINNED:
                    grant = GRANTS["both-secret" if PINNED[secret] == query["remote_ip"]
                                   else "nothing"]
                    body = json.dumps(grant).encode()
                    handler.send_response(200)
                    handler.send_header("Content-Length", str(len(body)))
                    handler.end_headers()
                    handler.wfile.write(body)
                    return
                if secret not in GRANTS:
                    handler.send_response(500)
                    handler.end_headers()
                    return
                body = json.dumps(GRANTS[secret]).encode()
                handler.send_response(200)
                handler.send_header("Content-Length", str(len(body)))
                handler.end_headers()
                handler.wfile.write(body)

            def log_message(handler, *args):
                pass
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def auth_server():
    server = AuthServer()
    yield server
    server.shutdown()


@pytest.fixture
def broker(processes, auth_server):
    _, port = processes.broker("--auth-http-address", auth_server.address,
                               "--log-level", "debug")
    return port


def auth(wire, secret: str):
    wire.command("AUTH", secret.encode())
    return wire.frame()


def test_identify_says_auth_is_required(broker):
    w = Wire(broker)
    assert json.loads(w.identify(feature_negotiation=True)[1])["auth_required"] is True


def test_publish_needs_auth_first_and_a_matching_grant(broker, auth_server):
    w = Wire(broker)
    assert w.pub("orders", b"x") == (FRAME_ERROR, b"E_AUTH_FIRST AUTH required before PUB")
    assert w.closed()
    w = Wire(broker)
    assert auth(w, "pub-secret") == (FRAME_RESPONSE, b'{"identity":"producer",'
                                     b'"identity_url":"http://ids/p","permission_count":1}')
    assert w.pub("orders", b"x") == (FRAME_RESPONSE, b"OK")
    assert w.mpub("orders", [b"y", b"z"]) == (FRAME_RESPONSE, b"OK")
    assert w.pub("other", b"x") == (FRAME_ERROR,
                                    b'E_UNAUTHORIZED AUTH failed for PUB on "other" ""')
    assert w.closed()
    assert auth_server.queries[0] == {"remote_ip": "127.0.0.1", "tls": "false",
                                      "secret": "pub-secret"}


def test_subscribe_needs_the_channel_regex_and_subscribe_permission(broker):
    w = Wire(broker)
    auth(w, "sub-secret")
    assert w.sub("orders", "shipping") == (
        FRAME_ERROR, b'E_UNAUTHORIZED AUTH failed for SUB on "orders" "shipping"')
    w = Wire(broker)
    auth(w, "sub-secret")
    assert w.pub("orders", b"x") == (FRAME_ERROR,
                                     b'E_UNAUTHORIZED AUTH failed for PUB on "orders" ""')
    w = Wire(broker)
    auth(w, "sub-secret")
    assert w.sub("orders", "billing-eu") == (FRAME_RESPONSE, b"OK")
    w.command("AUTH", b"sub-secret")
    assert w.frame() == (FRAME_ERROR, b"E_INVALID cannot AUTH in current state")


def test_auth_errors(broker, processes):
    w = Wire(broker)
    auth(w, "both-secret")
    assert auth(w, "both-secret") == (FRAME_ERROR, b"E_INVALID AUTH already set")
    assert auth(Wire(broker), "nothing") == (
        FRAME_ERROR, b"E_UNAUTHORIZED AUTH no authorizations found")
    assert auth(Wire(broker), "unknown-to-the-server") == (FRAME_ERROR,
                                                          b"E_AUTH_FAILED AUTH failed")
    w = Wire(broker)
    w.command("AUTH extra", b"x")
    assert w.frame() == (FRAME_ERROR, b"E_INVALID AUTH invalid number of parameters")
    w = Wire(broker)
    w.send(b"AUTH\n" + struct.pack(">i", 0))
    assert w.frame() == (FRAME_ERROR, b"E_BAD_BODY AUTH invalid body size 0")
    _, plain = processes.broker()
    assert auth(Wire(plain), "x") == (FRAME_ERROR, b"E_AUTH_DISABLED AUTH disabled")


def test_grants_are_asked_again_after_their_ttl(broker, auth_server):
    w = Wire(broker)
    auth(w, "pub-secret")                                 # ttl 1 s
    assert w.pub("orders", b"1") == (FRAME_RESPONSE, b"OK")
    assert auth_server.asked["pub-secret"] == 1
    time.sleep(1.1)
    assert w.pub("orders", b"2") == (FRAME_RESPONSE, b"OK")
    assert auth_server.asked["pub-secret"] == 2
    assert w.pub("orders", b"3") == (FRAME_RESPONSE, b"OK")
    assert auth_server.asked["pub-secret"] == 2


def test_an_auth_server_that_fails_later_fails_the_command(processes, auth_server):
    _, port = processes.broker("--auth-http-address", auth_server.address)
    w = Wire(port)
    auth(w, "pub-secret")
    auth_server.shutdown()
    auth_server.server_close()
    time.sleep(1.1)
    assert w.pub("orders", b"x") == (FRAME_ERROR, b"E_AUTH_FAILED AUTH failed")
    assert w.closed()


def test_static_auth_file(processes, tmp_path):
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"file-secret": GRANTS["pub-secret"]}))
    _, port = processes.broker("--auth-file", str(path))
    w = Wire(port)
    assert json.loads(auth(w, "file-secret")[1])["identity"] == "producer"
    assert w.pub("orders", b"x") == (FRAME_RESPONSE, b"OK")
    assert auth(Wire(port), "other") == (FRAME_ERROR,
                                         b"E_UNAUTHORIZED AUTH no authorizations found")


def test_a_bad_auth_file_stops_the_broker_with_one_line(tmp_path):
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"s": {"ttl": 5, "authorizations": [{"topic": "(",
                                                                    "channels": [],
                                                                    "permissions": []}]}}))
    out = subprocess.run([sys.executable, "-m", "relay", "broker", "--auth-file", str(path),
                          "--tcp-address", "127.0.0.1:0", "--http-address", "",
                          "--lookupd-http-address", ""],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.startswith(f"relay: auth file {path}: ")
    assert out.stderr.count("\n") == 1


def test_http_api_needs_a_bearer_secret(broker, processes, auth_server):
    api = Api(broker, processes.http_ports[broker])
    assert api.json("POST", "/pub?topic=orders", b"x") == (401, {"message": "AUTH_REQUIRED"})

    def post(path, secret, body=b"x"):
        status, data, _ = api.request("POST", path, body,
                                      {"Authorization": f"Bearer {secret}"})
        return status, data
    assert post("/pub?topic=orders", "pub-secret") == (200, b"OK")
    assert post("/mpub?topic=orders", "pub-secret", b"a\nb") == (200, b"OK")
    assert post("/pub?topic=other", "pub-secret") == (403, b'{"message":"UNAUTHORIZED"}')
    assert post("/channel/create?topic=orders&channel=billing", "sub-secret") == (200, b"")
    assert post("/channel/create?topic=orders&channel=x", "sub-secret") == (
        403, b'{"message":"UNAUTHORIZED"}')
    assert post("/pub?topic=orders", "unknown-to-the-server") == (
        503, b'{"message":"AUTH_FAILED"}')
    assert api.json("POST", "/topic/ttl?topic=orders&ttl=1m") == (
        401, {"message": "AUTH_REQUIRED"})     # relay's controls need grants too
    assert post("/topic/dedup?topic=other&window=1m", "pub-secret") == (
        403, b'{"message":"UNAUTHORIZED"}')
    assert post("/channel/limit?topic=orders&channel=x&max_depth=3", "sub-secret") == (
        403, b'{"message":"UNAUTHORIZED"}')
    assert post("/channel/ttl?topic=orders&channel=billing&ttl=1ms", "pub-secret") == (
        403, b'{"message":"UNAUTHORIZED"}')       # a channel's own needs its grant
    assert post("/topic/ttl?topic=orders&ttl=1m", "pub-secret")[0] == 200
    assert api.request("GET", "/stats")[0] == 200
    assert api.request("GET", "/ping")[:2] == (200, b"OK")


def test_http_grants_are_per_client_address(broker, processes, auth_server):
    """The auth server grants the pinned secret to 127.0.0.2 only: each address gets its
    own answer, in either order (a grant cached per secret let 127.0.0.1 and .3 in, and
    a denial cached first locked .2 out)."""
    http_port = processes.http_ports[broker]

    def pub_from(address):
        conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=5,
                                          source_address=(address, 0))
        conn.request("POST", "/pub?topic=orders", b"x",
                     {"Authorization": "Bearer pinned-secret"})
        reply = conn.getresponse()
        status = reply.status, reply.read()
        conn.close()
        return status
    denied = (403, b'{"message":"UNAUTHORIZED"}')
    assert pub_from("127.0.0.1") == denied
    assert pub_from("127.0.0.2") == (200, b"OK")
    assert pub_from("127.0.0.3") == denied
    assert pub_from("127.0.0.2") == (200, b"OK")
    assert auth_server.asked["pinned-secret"] == 3       # each address once, for its ttl
    assert sorted(q["remote_ip"] for q in auth_server.queries
                  if q["secret"] == "pinned-secret") == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]


def test_every_change_over_http_needs_a_grant(broker, processes, auth_server):
    """The lookupd port's tombstone and the nsqd port's PUT /config need auth too; an
    anonymous tombstone used to empty /lookup on every broker."""
    lookupd = Api(broker, processes.lookupd_ports[broker])
    api = Api(broker, processes.http_ports[broker])
    node = f"{socket.gethostname()}:{processes.http_ports[broker]}"
    bearer = {"Authorization": "Bearer both-secret"}
    assert api.request("POST", "/pub?topic=orders", b"x", bearer)[:2] == (200, b"OK")
    tombstone = f"/topic/tombstone?topic=orders&node={node}"
    assert lookupd.request("POST", tombstone)[:2] == (401, b'{"message":"AUTH_REQUIRED"}')
    assert lookupd.request("POST", tombstone, None,
                           {"Authorization": "Bearer sub-secret"})[:2] == (
        403, b'{"message":"UNAUTHORIZED"}')
    assert len(lookupd.json("GET", "/lookup?topic=orders")[1]["producers"]) == 1
    assert lookupd.request("POST", tombstone, None, bearer)[:2] == (200, b"")
    assert lookupd.json("GET", "/lookup?topic=orders")[1]["producers"] == []
    assert lookupd.request("POST", "/topic/create?topic=x")[0] == 401
    assert api.request("PUT", "/config/log_level", b"info")[:2] == (
        401, b'{"message":"AUTH_REQUIRED"}')
    assert api.request("PUT", "/config/log_level", b"info",
                       {"Authorization": "Bearer nothing"})[:2] == (
        403, b'{"message":"UNAUTHORIZED"}')
    assert api.request("PUT", "/config/log_level", b"info", bearer)[:2] == (200, b'"info"')
    assert api.request("GET", "/config/log_level")[:2] == (200, b'"info"')


def test_secrets_never_reach_the_logs(broker, processes):
    sent = ["pub-secret", "unknown-to-the-server"]
    w = Wire(broker)
    auth(w, sent[0])
    assert w.pub("other", b"x")[0] == FRAME_ERROR
    assert auth(Wire(broker), sent[1])[0] == FRAME_ERROR
    Api(broker, processes.http_ports[broker]).request(
        "POST", "/pub?topic=orders", b"x", {"Authorization": f"Bearer {sent[1]}"})
    assert wait_for(lambda: "http: AUTH failed" in processes.logs())
    logs = processes.logs()
    assert "AUTH failed" in logs and "level=debug" in logs
    assert [s for s in sent if s in logs] == []


def test_pynsq_with_auth_secret(broker):
    sizes = [1, 1000]
    expected = sorted(hashlib.sha256(body_of(n)).hexdigest() for n in sizes)
    assert run_pynsq_secure(broker, "orders", {"auth_secret": "both-secret"}, sizes) == {
        "published": 2, "received": expected}


def test_the_auth_server_learns_tls_and_the_certificate_name(processes, auth_server, pki):
    port, _ = tls_broker(processes, pki, "--auth-http-address", auth_server.address,
                         "--tls-root-ca-file", pki["ca"],
                         "--tls-client-auth-policy", "require-verify")
    w = Secure(port)
    assert w.negotiate(pki, client_cert=True, tls_v1=True)["auth_required"] is True
    w.command("AUTH", b"both-secret")
    assert w.frame()[0] == FRAME_RESPONSE
    assert auth_server.queries[-1] == {"remote_ip": "127.0.0.1", "tls": "true",
                                       "secret": "both-secret", "common_name": "worker-7"}
