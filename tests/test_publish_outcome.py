"""A publish answered as failed is not stored; one that Redis may have stored all the
same is answered as of unknown outcome (issue 46, item 7). Between the broker and its
Redis, a proxy holds up for DELAY each call that holds MARKER (a body, or a topic's
name), so that call is sent and waits past --redis-timeout, as on a loaded Redis."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import redis

from relay import embedded
from relay.codec import FRAME_ERROR
from relay.errors import NoAnswer, OutcomeUnknown, StoreConnectionError
from relay.store import Store
from relay.store.connection import connect
from relay.store.keys import TopicKeys
from tests.helpers.api import Api
from tests.helpers.wait import wait_for
from tests.helpers.wire import Wire

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

MARKER = b"slow-call"
DELAY = 2.0
UNKNOWN = b"outcome unknown, it may have been published: no answer from redis within 1000ms"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def slow_calls(processes, own_redis):
    """A broker whose Redis calls holding MARKER reach Redis DELAY late, with
    --redis-timeout 1s: (its TCP port, its Api, a client of the Redis itself)."""
    redis_port, _, _ = own_redis
    proxy_port = embedded.free_port()
    proxy = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.delay_proxy", f"127.0.0.1:{proxy_port}",
         f"127.0.0.1:{redis_port}", str(int(DELAY * 1000)), MARKER.decode()], cwd=ROOT)
    try:
        assert wait_for(lambda: answers(proxy_port), timeout=10)
        _, port = processes.broker("--redis-url", f"redis://127.0.0.1:{proxy_port}/0",
                                   "--redis-timeout", "1s")
        yield port, Api(port, processes.http_ports[port]), redis.Redis(port=redis_port)
    finally:
        proxy.kill()
        proxy.wait()


def answers(port: int) -> bool:
    try:
        return redis.Redis(port=port).ping()
    except redis.exceptions.ConnectionError:
        return False


def published(direct: redis.Redis, topic: str) -> int:
    """How many messages the topic's (one) part ever took, read in Redis itself."""
    return int(direct.get(TopicKeys.of(topic).ids) or 0)


def keyed(w: Wire):
    w.identify(relay_dedup=True)
    w.command("PUB t key-1", MARKER)
    return w.frame()


@pytest.mark.parametrize("command, send, count", [
    ("PUB", lambda w: w.pub("t", MARKER), 1),
    ("MPUB", lambda w: w.mpub("t", [MARKER, b"second"]), 2),
    ("DPUB", lambda w: w.command("DPUB t 60000", MARKER).frame(), 1),
    ("PUB", keyed, 1),
], ids=["pub", "mpub", "dpub", "keyed-pub"])
def test_a_publish_sent_and_not_answered_may_have_been_published(slow_calls, command, send,
                                                                  count):
    """Redis ran it after the broker gave up waiting: the answer said it failed, and a
    producer that published again stored it twice."""
    port, _, direct = slow_calls
    w = Wire(port)
    assert send(w) == (FRAME_ERROR, f"E_{command}_FAILED {command} ".encode() + UNKNOWN)
    assert w.closed()
    assert wait_for(lambda: published(direct, "t") == count, timeout=DELAY + 3)


def keyed_new(w: Wire):
    w.identify(relay_dedup=True)
    w.command(f"PUB {MARKER.decode()} key-1", b"m")
    return w.frame()


@pytest.mark.parametrize("send, cause", [
    (lambda w: w.pub(MARKER.decode(), b"m"), b"no answer from redis within 1000ms (not sent)"),
    (keyed_new, b"no answer from redis within 1000ms"),
], ids=["pub", "keyed-pub"])
def test_a_pub_never_sent_failed(slow_calls, send, cause):
    """Its topic's partition count, read first, waited out the timeout: the PUB itself
    was never sent, so it failed (a keyed one closed the connection without a word)."""
    port, _, direct = slow_calls
    topic = MARKER.decode()
    w = Wire(port)
    assert send(w) == (FRAME_ERROR, b"E_PUB_FAILED PUB failed: " + cause)
    time.sleep(DELAY + 1)   # past what the proxy held up
    assert published(direct, topic) == 0
    assert Wire(port).pub("t", b"m") == (0, b"OK")
    assert published(direct, "t") == 1


@pytest.mark.parametrize("path, body, count", [
    ("/pub?topic=t", MARKER, 1),
    ("/mpub?topic=t", MARKER + b"\nsecond", 2),
    ("/pub?topic=t&id=key-1", MARKER, 1),
], ids=["pub", "mpub", "keyed-pub"])
def test_an_http_publish_sent_and_not_answered_may_have_been_published(slow_calls, path,
                                                                       body, count):
    _, api, direct = slow_calls
    status, data, headers = api.request("POST", path, body)
    assert (status, json.loads(data), headers["X-Relay-Outcome"]) == (
        503, {"message": UNKNOWN.decode()}, "unknown")
    assert wait_for(lambda: published(direct, "t") == count, timeout=DELAY + 3)


def test_an_http_publish_that_could_not_read_its_topic_failed(slow_calls):
    """A new topic's partition count is read first (the publish's op is made with it):
    here that read timed out, and the message was never sent."""
    _, api, direct = slow_calls
    topic = MARKER.decode()
    status, data, headers = api.request("POST", f"/pub?topic={topic}", b"m")
    assert (status, json.loads(data), headers["X-Relay-Outcome"]) == (
        503, {"message": "no answer from redis within 1000ms (not sent)"}, "failed")
    time.sleep(DELAY + 1)   # past what the proxy held up
    assert published(direct, topic) == 0
    assert api.request("POST", "/pub?topic=t", b"m")[:2] == (200, b"OK")
    assert published(direct, "t") == 1


def test_the_broker_connection_tells_a_call_sent_from_one_refused(own_redis):
    """The group commit's own connection (a dedicated Store): a call sent to a hung
    Redis has no answer, and runs once Redis is resumed; one to a Redis gone is refused
    before it is sent."""
    redis_port, server, _ = own_redis
    store = Store(connect(f"redis://127.0.0.1:{redis_port}/0", 0.5), True)
    direct = redis.Redis(port=redis_port)
    assert store.run(store.publish_op("t", [b"first"])) == 1
    server["proc"].send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(NoAnswer, match="^no answer from redis within 500ms$"):
            store.run(store.publish_op("t", [b"sent"]))
    finally:
        server["proc"].send_signal(signal.SIGCONT)
    assert wait_for(lambda: published(direct, "t") == 2)
    server["proc"].kill()
    server["proc"].wait()
    with pytest.raises(StoreConnectionError, match="Connection refused") as refused:
        store.run(store.publish_op("t", [b"refused"]))
    assert not isinstance(refused.value, OutcomeUnknown)
