"""The HTTP API's framing against hostile and careless clients, over raw sockets: the
answers nsqd (Go's net/http) gives, nothing run for a request that did not arrive whole,
no request smuggled inside another's body, and no client able to stall the others or
flood the log."""

import http.client
import os
import re
import socket
import statistics
import time

import pytest

from relay.store.connection import connect
from relay.store.keys import TopicKeys
from scripts.hostile import aborted_uploads
from tests.helpers.wait import wait_for
from tests.helpers.witness import HttpWitness, Witness

STATUS = re.compile(rb"HTTP/1\.1 (\d{3} [^\r:]*)")
pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

# A witness's slowest answer during an attack (the defects took 5 s and more); the
# issue's target on a quiet machine is 0.1 s, RELIABILITY.md has the measured figures.
SLOWEST = 0.5


@pytest.fixture
def broker(processes):
    """(tcp port, http port) of a broker with a scanner."""
    _, port = processes.broker()
    processes.scanner()
    return port, processes.http_ports[port]


def exchange(http_port: int, data: bytes, wait: float = 5.0) -> tuple[bytes, bool]:
    """Send data, read until the broker closes or `wait` passes: (what came back,
    whether the broker closed)."""
    sock = socket.create_connection(("127.0.0.1", http_port), timeout=wait)
    sock.sendall(data)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
        closed = True
    except socket.timeout:
        closed = False
    except ConnectionResetError:
        closed = True
    sock.close()
    return got, closed


def statuses(answer: bytes) -> list[str]:
    """The status lines in an answer without the reason's detail after a colon, e.g.
    ["HTTP/1.1 200 OK", "HTTP/1.1 400 Bad Request"] (for "400 Bad Request: invalid
    URL escape")."""
    return [f"HTTP/1.1 {status.decode()}" for status in STATUS.findall(answer)]


def topic_exists(redis_url: str, topic: str) -> bool:
    return bool(connect(redis_url).exists(TopicKeys.of(topic).meta))


def test_a_keep_alive_client_is_answered_at_once(broker, processes):
    """Headers and body went out in two writes without TCP_NODELAY: Nagle held the body
    until the client's delayed ACK, 41-44 ms per answer on one keep-alive connection.
    Both HTTP servers: nsqd's API and the lookupd port."""
    port, http_port = broker
    times = []
    for server, path, body in [(http_port, "/pub?topic=ka", b"x" * 200),
                               (http_port, "/ping", None), (http_port, "/info", None),
                               (processes.lookupd_ports[port], "/nodes", None)]:
        conn = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
        for _ in range(50):
            started = time.perf_counter()
            conn.request("POST" if body else "GET", path, body)
            response = conn.getresponse()
            response.read()
            times.append(time.perf_counter() - started)
            assert response.status == 200
        conn.close()
    assert statistics.median(times) < 0.02, times
    assert sum(t >= 0.04 for t in times) < 20, times


SMUGGLED = b"POST /pub?topic=smuggled HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx"
REFUSED_FRAMING = [
    (b"Content-Length: 3\r\nContent-Length: 74\r\n", "400 Bad Request"),
    (b"Content-Length : 74\r\n", "400 Bad Request"),
    (b"X-No-Colon\r\nContent-Length: 74\r\nConnection: close\r\n", "400 Bad Request"),
    (b"Transfer-Encoding: identity, chunked\r\n", "501 Not Implemented"),
    (b"Transfer-Encoding: chunked, identity\r\n", "501 Not Implemented"),
    (b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", "501 Not Implemented"),
    (b"Transfer-Encoding: xchunked\r\nContent-Length: 74\r\n", "501 Not Implemented"),
    (b"Content-Length: 74\r\nTransfer-Encoding: chunked\r\n", "400 Bad Request"),
    (b"Content-Length: +3\r\n", "400 Bad Request"),
    (b"Content-Length: 99999999999999999999999\r\n", "400 Bad Request"),
]


@pytest.mark.parametrize("headers,status", REFUSED_FRAMING)
@pytest.mark.reuse_processes     # one broker for its cases (tests/helpers/reuse.py)
def test_ambiguous_framing_is_refused_and_the_connection_closed(broker, redis_url,
                                                                headers, status):
    """Framing relay read one way and nsqd (or a proxy) another let the rest of a body
    run as a hidden request: here a publish to `smuggled`."""
    _, http_port = broker
    body = b"abc" + SMUGGLED
    request = b"POST /pub?topic=front HTTP/1.1\r\nHost: a\r\n" + headers + b"\r\n" + body
    answer, closed = exchange(http_port, request)
    assert statuses(answer) == [f"HTTP/1.1 {status}"]
    assert b"\r\nConnection: close\r\n" in answer
    assert closed
    assert not topic_exists(redis_url, "smuggled")
    assert not topic_exists(redis_url, "front")


def test_a_bad_chunk_size_is_refused(broker, redis_url):
    _, http_port = broker
    answer, closed = exchange(http_port, b"POST /pub?topic=front HTTP/1.1\r\nHost: a\r\n"
                                         b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n")
    assert (statuses(answer), closed) == (["HTTP/1.1 400 Bad Request"], True)
    assert not topic_exists(redis_url, "front")


HALF_SENT = [
    b"POST /topic/create?topic=trunc HTTP/1.1\r\nHost: a\r\n",
    b"POST /topic/create?topic=trunc HTTP/1.1\r\nHost: a\r\n\r",
    b"POST /topic/create?topic=trunc HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nab",
    b"POST /topic/create?topic=trunc HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
    b"\r\n3\r\nabc\r\n",
    b"POST /pub?topic=trunc HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nab",
]


@pytest.mark.parametrize("partial", HALF_SENT)
@pytest.mark.reuse_processes     # one broker for its cases (tests/helpers/reuse.py)
def test_a_request_cut_short_runs_nothing(broker, redis_url, partial):
    """A client that hung up mid-request had its request run: the topic was created."""
    _, http_port = broker
    sock = socket.create_connection(("127.0.0.1", http_port), timeout=5)
    sock.sendall(partial)
    sock.shutdown(socket.SHUT_WR)
    assert sock.recv(100) == b""
    sock.close()
    answer, _ = exchange(http_port, b"GET /ping HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert statuses(answer) == ["HTTP/1.1 200 OK"]     # the broker got past it
    assert not topic_exists(redis_url, "trunc")


@pytest.mark.parametrize("expect", [b"", b"Expect: 100-continue\r\n"])
@pytest.mark.reuse_processes     # one broker for its cases (tests/helpers/reuse.py)
def test_a_refused_body_closes_the_connection(broker, expect):
    """After a 413 the connection stayed open, read the next request as the body it was
    discarding, and never answered it."""
    _, http_port = broker
    answer, closed = exchange(http_port, b"POST /pub?topic=big HTTP/1.1\r\nHost: a\r\n"
                                         b"Content-Length: 2000000\r\n" + expect + b"\r\n"
                                         b"GET /ping HTTP/1.1\r\nHost: a\r\n\r\n")
    assert statuses(answer) == ["HTTP/1.1 413 Request Entity Too Large"]
    assert answer.endswith(b'\r\n\r\n{"message":"MSG_TOO_BIG"}')
    assert b"\r\nConnection: close\r\n" in answer
    assert closed


def test_a_body_within_the_limit_is_asked_for_with_100_continue(broker):
    _, http_port = broker
    sock = socket.create_connection(("127.0.0.1", http_port), timeout=5)
    sock.sendall(b"POST /pub?topic=cont HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n"
                 b"Expect: 100-continue\r\n\r\n")
    assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
    sock.sendall(b"abc")
    assert statuses(sock.recv(1000)) == ["HTTP/1.1 200 OK"]
    sock.close()


PATH = b"GET %s HTTP/1.1\r\nHost: a\r\n\r\n"
NSQD_ANSWERS = [
    (PATH % b"/stats?topic=%zz", "400 Bad Request", b'{"message":"INVALID_REQUEST"}'),
    (PATH % b"/stats?topic=a;b", "400 Bad Request", b'{"message":"INVALID_REQUEST"}'),
    (PATH % b"/p%zzing", "400 Bad Request", b"400 Bad Request: invalid URL escape"),
    (b"GET /ping HTTP/1.1\r\n\r\n", "400 Bad Request",
     b"400 Bad Request: missing required Host header"),
    (b"GET /ping HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "400 Bad Request",
     b"400 Bad Request: too many Host headers"),
    (b"GET /ping HTTP/9.9\r\nHost: a\r\n\r\n", "505 HTTP Version Not Supported",
     b"505 HTTP Version Not Supported: unsupported protocol version"),
    (b"GET /ping HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n", "417 Expectation Failed",
     b"Content-Length: 0"),
]


@pytest.mark.parametrize("request_,status,text", NSQD_ANSWERS)
@pytest.mark.reuse_processes     # one broker for its cases (tests/helpers/reuse.py)
def test_malformed_requests_get_nsqds_answers(broker, request_, status, text):
    """Answered as nsqd answers; an error of nsqd's API (INVALID_REQUEST) leaves the
    connection serving, one of Go's server closes it."""
    _, http_port = broker
    answer, closed = exchange(http_port, request_ + PATH % b"/ping")
    answers = statuses(answer)
    assert answers[0] == f"HTTP/1.1 {status}"
    assert text in answer
    assert answers[1:] == ([] if closed else ["HTTP/1.1 200 OK"])
    assert closed == (b"INVALID_REQUEST" not in text)


@pytest.mark.parametrize("method,path,code,location", [
    ("GET", "//ping", 301, "/ping"), ("GET", "/../ping", 301, "/ping"),
    ("GET", "/ping/", 301, "/ping"), ("GET", "/PING", 301, "/ping"),
    ("POST", "/pub/?topic=t", 307, "/pub?topic=t"),
])
@pytest.mark.reuse_processes     # one broker for its cases (tests/helpers/reuse.py)
def test_a_path_that_means_a_route_redirects_to_it(broker, method, path, code, location):
    """nsqd's router redirects (301 for GET, 307 to keep the method and body)."""
    _, http_port = broker
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=5)
    conn.request(method, path, b"x" if method == "POST" else None)
    response = conn.getresponse()
    response.read()
    assert (response.status, response.getheader("Location")) == (code, location)
    conn.close()


def test_nsqds_limits_on_heads_hold(broker):
    """relay refused more than 100 headers and a request line over 8 KB, which nsqd takes
    (Go: 1 MB of head); past 1 MB it is Go's 431."""
    _, http_port = broker
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(150))
    answer, _ = exchange(http_port, b"GET /ping HTTP/1.1\r\nHost: a\r\n" + many +
                         b"Connection: close\r\n\r\n")
    assert statuses(answer) == ["HTTP/1.1 200 OK"]
    query = b"a" * 500_000
    answer, _ = exchange(http_port, b"GET /stats?format=json&x=" + query + b" HTTP/1.1\r\n"
                         b"Host: a\r\nConnection: close\r\n\r\n")
    assert statuses(answer) == ["HTTP/1.1 200 OK"]
    huge = b"X-Big: " + b"v" * 1_100_000 + b"\r\n"
    answer, closed = exchange(http_port, b"GET /ping HTTP/1.1\r\nHost: a\r\n" + huge + b"\r\n")
    assert (statuses(answer), closed) == (["HTTP/1.1 431 Request Header Fields Too Large"], True)


def test_pipelined_requests_are_answered_in_order_in_one_write(broker):
    _, http_port = broker
    answer, closed = exchange(http_port, (b"POST /pub?topic=pl HTTP/1.1\r\nHost: a\r\n"
                                          b"Content-Length: 1\r\n\r\nx") * 3 +
                              b"GET /nowhere HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert statuses(answer) == ["HTTP/1.1 200 OK"] * 3 + ["HTTP/1.1 404 Not Found"]
    assert closed


def broker_log(processes) -> bytes:
    with open(os.path.join(processes.tmpdir, "broker-0.log"), "rb") as f:
        return f.read()


def test_an_abort_flood_stalls_no_one_and_stays_out_of_the_log(broker, processes, redis_url):
    """Each aborted upload logged a traceback (1 KB): 17,488 aborts in 15 s wrote 18 MB,
    held innocent publishes up to 6 s and failed some. Now an abort is a counted fault:
    a debug line at most, and one summary line a window at info."""
    port, http_port = broker
    witnesses = [Witness(port), HttpWitness(http_port)]
    before = len(broker_log(processes))
    aborts = aborted_uploads(http_port, 15.0)
    slowest = [w.stop() for w in witnesses]
    summary = b"aborted HTTP requests in the last 10 s from 127.0.0.1"
    # the 15 s span two fault windows (the second opened by the first abort after the
    # first summary, 10 s in): both end with a summary, the second 5 s or so from now
    assert wait_for(lambda: broker_log(processes)[before:].count(summary) >= 2,
                    timeout=15.0, interval=0.1)
    assert max(slowest) < SLOWEST, (slowest, aborts)
    written = broker_log(processes)[before:]
    assert len(written) < 100_000
    assert b"Traceback" not in written and b"level=error" not in written
    assert b"aborted HTTP requests in the last 10 s from 127.0.0.1" in written
    assert not topic_exists(redis_url, "lf")
    assert aborts > 1000


def test_a_slow_drip_and_its_sudden_close_run_nothing(broker, redis_url):
    """500 connections dripping a /ping a byte at a time, then closing together: each
    ran a partial /ping (a Redis PING and SET), the witness waited up to 0.4 s and the
    broker's Redis pool grew to its cap."""
    port, http_port = broker
    redis = connect(redis_url)
    clients = redis.info("clients")["connected_clients"]
    request = b"POST /topic/create?topic=drip HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n"
    socks = [socket.create_connection(("127.0.0.1", http_port)) for _ in range(500)]
    witnesses = [Witness(port), HttpWitness(http_port)]
    for i in range(0, len(request), 4):     # the body never comes
        for sock in socks:
            sock.send(request[i:i + 4])
        time.sleep(0.01)
    for sock in socks:
        sock.close()
    time.sleep(0.5)
    assert max(w.stop() for w in witnesses) < SLOWEST
    assert not topic_exists(redis_url, "drip")
    assert redis.info("clients")["connected_clients"] < clients + 10
