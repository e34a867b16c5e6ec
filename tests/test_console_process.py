"""`relay console` as a process, as the Procfile runs it: served by the broker's strict
HTTP/1.1 front end (keep-alive, framing, no half-read request run, no traceback for a
client's fault), read-only unless --console-write, and no Redis password in a page or
a log."""

import http.client
import re
import socket
import time
import urllib.parse

import pytest
import redis

from relay.store import Store
from relay.store.connection import connect
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration


def session(port: int, path: str) -> tuple[http.client.HTTPConnection, str, str]:
    """A keep-alive connection that loaded `path`: it, the session cookie, the CSRF token."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path)
    answer = conn.getresponse()
    page = answer.read().decode()
    assert answer.status == 200, page
    cookie = answer.getheader("Set-Cookie").split(";")[0]
    return conn, cookie, re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


def action_request(cookie: str, token: str, **form) -> bytes:
    body = urllib.parse.urlencode({"csrf_token": token, **form}).encode()
    return (b"POST /actions/pause HTTP/1.1\r\nHost: a\r\nCookie: " + cookie.encode()
            + b"\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def received(sock: socket.socket) -> bytes:
    sock.settimeout(5)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.fixture
def orders(redis_url):
    store = Store(connect(redis_url))
    store.control.create_channel("orders", "billing")
    store.publish("orders", [b"one"])
    return store


def test_keep_alive_and_a_half_sent_action_runs_nothing(processes, orders):
    _, port = processes.console("--console-write")
    conn, cookie, token = session(port, "/topics/orders/billing")
    for _ in range(20):     # one connection, every answer whole
        conn.request("GET", "/live/topics/orders/billing", headers={"Cookie": cookie})
        answer = conn.getresponse()
        assert answer.status == 200 and b"in flight" in answer.read()
    whole = action_request(cookie, token, topic="orders", channel="billing",
                           confirmed="yes")
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(whole[:-5])        # the client hangs up before its last bytes
    time.sleep(0.5)
    assert not orders.reads.read_channel("orders", "billing")["paused"]
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(whole)
        sock.shutdown(socket.SHUT_WR)
        assert received(sock).startswith(b"HTTP/1.1 302 ")
    assert orders.reads.read_channel("orders", "billing")["paused"]


def test_strict_framing_and_no_traceback(processes, orders):
    proc, port = processes.console("--console-write")
    _, cookie, token = session(port, "/topics/orders/billing")
    smuggled = action_request(cookie, token, topic="orders", channel="billing",
                              confirmed="yes").replace(b"Content-Length:",
                                                       b"Content-Length: 3\r\nContent-Length:")
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(smuggled)
        assert received(sock).startswith(b"HTTP/1.1 400 Bad Request")
    big = b"x" * 70_000
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /actions/pause HTTP/1.1\r\nHost: a\r\nContent-Length: "
                     + str(len(big)).encode() + b"\r\n\r\n")
        assert received(sock).startswith(b"HTTP/1.1 413 ")
    assert not orders.reads.read_channel("orders", "billing")["paused"]
    proc.terminate()
    proc.wait(10)
    assert "Traceback" not in processes.logs()


def test_read_only_unless_told(processes, orders):
    _, port = processes.console()
    _, cookie, token = session(port, "/topics/orders/billing")
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(action_request(cookie, token, topic="orders", channel="billing",
                                    confirmed="yes"))
        sock.shutdown(socket.SHUT_WR)
        answer = received(sock)
    assert answer.startswith(b"HTTP/1.1 403 ") and b"read-only" in answer
    assert not orders.reads.read_channel("orders", "billing")["paused"]


def test_no_redis_password_in_pages_or_logs(processes, own_redis):
    redis_port, server, _ = own_redis
    redis.Redis(port=redis_port).config_set("requirepass", "hunter2")
    url = f"redis://:hunter2@127.0.0.1:{redis_port}/0"
    Store(connect(url)).publish("orders", [b"one"])
    proc, port = processes.console("--redis-url", url, "--redis-timeout", "500ms")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/")
    page = conn.getresponse().read().decode()
    assert "orders" in page and "hunter2" not in page
    server["proc"].kill()
    server["proc"].wait()
    conn.request("GET", "/topics/orders")
    answer = conn.getresponse()
    page = answer.read().decode()
    assert answer.status == 503
    assert f"redis at redis://:***@127.0.0.1:{redis_port}/0 is unreachable" in page
    wait_for(lambda: "unreachable" in processes.logs())
    proc.terminate()
    proc.wait(10)
    assert "hunter2" not in processes.logs()
