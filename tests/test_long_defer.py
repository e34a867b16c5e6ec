"""--max-defer-timeout: DPUB and /pub?defer= bounded apart from REQ's --max-req-timeout,
against real broker processes, on one Redis and on a cluster with partitioned topics."""

import json
import signal
import time

import pytest

from relay.codec import FRAME_ERROR, FRAME_RESPONSE
from tests.helpers.api import Api
from tests.helpers.wire import Wire, subscribed

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

OK = (FRAME_RESPONSE, b"OK")
LIMITS = ("--max-req-timeout", "1s", "--max-defer-timeout", "5s", "--topic-partitions", "2")


@pytest.fixture
def api(processes):
    """A broker whose DPUB may defer 5 s while REQ is held to 1 s, and a scanner."""
    _, port = processes.broker(*LIMITS)
    processes.scanner()
    return Api(port, processes.http_ports[port])


def test_dpub_up_to_the_defer_bound_is_taken(api):
    w = Wire(api.tcp_port)
    w.command("DPUB t 5000", b"at the bound")
    assert w.frame() == OK
    w.command("DPUB t 1001", b"past max-req-timeout")
    assert w.frame() == OK
    w.close()


def test_dpub_past_the_defer_bound_is_fatal_as_nsqd(api):
    w = Wire(api.tcp_port)
    w.command("DPUB t 5001")  # checked before any body is read
    assert w.frame() == (FRAME_ERROR, b"E_INVALID DPUB timeout 5001 out of range 0-5000")
    assert w.rest() == b""
    w.close()


def test_http_defer_bound(api):
    assert api.request("POST", "/pub?topic=t&defer=5000", b"x")[:2] == (200, b"OK")
    status, data, _ = api.request("POST", "/pub?topic=t&defer=5001", b"x")
    assert (status, json.loads(data)) == (400, {"message": "INVALID_DEFER"})


def test_config_shows_both_bounds_in_ns(api):
    assert api.json("GET", "/config/max_defer_timeout") == (200, 5_000_000_000)
    assert api.json("GET", "/config/max_req_timeout") == (200, 1_000_000_000)


def test_defer_bound_follows_max_req_timeout_when_unset(processes):
    _, port = processes.broker("--max-req-timeout", "2s")
    assert Api(port, processes.http_ports[port]).json(
        "GET", "/config/max_defer_timeout") == (200, 2_000_000_000)
    w = Wire(port)
    w.command("DPUB t 2001")
    assert w.frame() == (FRAME_ERROR, b"E_INVALID DPUB timeout 2001 out of range 0-2000")
    w.close()


def test_req_keeps_its_own_bound(api):
    """REQ 4000 is clamped to --max-req-timeout (1 s), not to the defer bound."""
    w = subscribed(api.tcp_port, "r", "c", rdy=1)
    producer = Wire(api.tcp_port)   # on w, the message may come before the PUB's OK
    assert producer.pub("r", b"again") == OK
    producer.close()
    _, attempts, msg_id, body = w.message()
    assert (attempts, body) == (1, b"again")
    w.command(b"REQ " + msg_id + b" 4000")
    asked = time.monotonic()
    _, attempts, again, body = w.message()
    assert (attempts, again, body) == (2, msg_id, b"again")
    assert 0.9 <= time.monotonic() - asked < 3.5
    w.close()


def test_long_defer_survives_a_broker_restart(processes):
    """A DPUB deferred past --max-req-timeout lives in Redis: after the broker is killed
    and another started, it is delivered when due, not before."""
    proc, port = processes.broker(*LIMITS)
    processes.scanner()
    subscribed(port, "later", "c").close()          # the channel, so the defer lands in it
    w = Wire(port)
    w.command("DPUB later 2000", b"wake me")
    assert w.frame() == OK
    published = time.monotonic()
    w.close()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _, port2 = processes.broker(*LIMITS)
    w = subscribed(port2, "later", "c", rdy=1)
    _, attempts, _, body = w.message()
    assert (attempts, body) == (1, b"wake me")
    assert 1.9 <= time.monotonic() - published < 5
    w.close()
