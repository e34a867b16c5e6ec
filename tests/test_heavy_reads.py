"""Heavy reads off the serving path (issue 57 item 2): /stats, /metrics and /nodes read
thousands of keys, once for all the requests that ask at once (relay/broker/http/
shared.py), and never hold the loop that answers publishers for long."""

import http.client
import json
import threading
import time

import gevent
import pytest

from relay.broker.http.shared import SharedReads
from relay.store import Store
from relay.store.connection import connect
from tests.helpers.witness import Witness

CHANNELS = 5000
POLLERS = 4
# the targets are /stats in 0.1 s and the witness's slowest PUB in 0.15 s beside 4
# pollers (BENCHMARKS.md has them beside nsqd); bounds for a shared 2-core machine
SLOWEST_STATS = 0.5
SLOWEST_PUB = 0.5


def test_requests_during_a_read_wait_for_the_next_and_share_it():
    """The first request starts a read; two that come while it runs get the next one,
    begun after they came (so it holds what their clients did before), read once."""
    shared, began = SharedReads(), []

    def read():
        began.append(time.monotonic())
        number = len(began)
        gevent.sleep(0.05)
        return number

    first = gevent.spawn(shared.read, "stats", read)
    gevent.sleep(0.01)
    came = time.monotonic()
    later = [gevent.spawn(shared.read, "stats", read) for _ in range(2)]
    other = gevent.spawn(shared.read, "metrics", read)
    gevent.joinall([first, *later, other], raise_error=True)
    assert [first.value, *(g.value for g in later)] == [1, 3, 3]
    assert other.value == 2     # another key's read is its own, at once
    assert len(began) == 3 and began[2] >= came


def test_a_read_that_fails_fails_every_request_that_shared_it():
    shared = SharedReads()

    def read():
        gevent.sleep(0.02)
        raise RuntimeError("redis gone")

    waiting = [gevent.spawn(shared.read, "stats", read) for _ in range(3)]
    gevent.joinall(waiting)
    assert [str(g.exception) for g in waiting] == ["redis gone"] * 3
    assert shared.read("stats", lambda: "back") == "back"


def get(http_port: int, path: str = "/stats?format=json") -> tuple[float, bytes]:
    """How long a GET took, and its body."""
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=60)
    started = time.perf_counter()
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    took = time.perf_counter() - started
    conn.close()
    assert response.status == 200
    return took, body


def channels(path: str, body: bytes) -> int:
    """The channels of the topic "wide" a /stats or /metrics body shows (the witness's
    topic is there too once it has published)."""
    if path == "/metrics":
        return body.count(b'relay_channel_depth{channel="c')
    [topic] = [t for t in json.loads(body)["topics"] if t["topic_name"] == "wide"]
    return len(topic["channels"])


@pytest.fixture
def wide(processes, redis_url) -> tuple[int, int]:
    """A broker whose topic "wide" has 5,000 channels of one message: its TCP and HTTP
    ports."""
    _, port = processes.broker()
    store = Store(connect(redis_url))
    for i in range(CHANNELS):
        store.subscribe("wide", f"c{i}", "test")
    store.publish("wide", [b"x"])
    return port, processes.http_ports[port]


@pytest.mark.integration
def test_stats_of_5000_channels(wide):
    _, http_port = wide
    get(http_port)          # the broker's first look at the topic
    took, body = get(http_port)
    [topic] = json.loads(body)["topics"]
    assert (len(topic["channels"]), {c["depth"] for c in topic["channels"]}) == (CHANNELS, {1})
    assert took < SLOWEST_STATS


@pytest.mark.integration
@pytest.mark.parametrize("path", ["/stats?format=json", "/metrics"])
def test_four_pollers_at_5000_channels_leave_publishers_served(wide, path):
    """/metrics formats 75,000 lines here (1.3 s): the broker's other greenlets get
    turns meanwhile (metrics.TurnTaking)."""
    port, http_port = wide
    witness = Witness(port)
    until, answers = time.monotonic() + 5, [[] for _ in range(POLLERS)]

    def poll(answered: list) -> None:
        """Bodies kept, read after: parsing 2 MB of JSON holds this process's GIL for
        tens of ms, which the witness's thread would wait for."""
        while time.monotonic() < until:
            answered.append(get(http_port, path)[1])
    pollers = [threading.Thread(target=poll, args=(a,)) for a in answers]
    for poller in pollers:
        poller.start()
    for poller in pollers:
        poller.join(60)
    assert witness.stop() < SLOWEST_PUB
    assert all(a and {channels(path, body) for body in a} == {CHANNELS} for a in answers)
