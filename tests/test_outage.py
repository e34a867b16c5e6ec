"""A Redis outage under a running broker, scanner and jobs worker: bounded errors,
then recovery with no manual step. The Redis here is the test's own, so it can be stopped and killed."""

import os
import signal
import threading
import time

import pytest
import redis
import rq

from relay import embedded
from workers.operations import QUEUE as JOBS_QUEUE
from tests.helpers.api import Api
from relay.codec import FRAME_ERROR
from tests.helpers.wait import wait_for, wait_until
from tests.helpers.wire import FRAME_RESPONSE, Wire

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out


def publish_until_ok(port, topic, body, timeout=15.0):
    """What a client with retries does: PUB again (new connection) until OK."""
    def publish():
        w = Wire(port)
        reply = w.pub(topic, body)
        w.close()
        return reply
    return wait_until(publish, lambda reply: reply == (FRAME_RESPONSE, b"OK"), timeout,
                      interval=0.2)


def test_redis_hang_and_crash_fail_fast_then_recover_by_themselves(processes, own_redis):
    redis_port, server, restart = own_redis
    url = f"redis://127.0.0.1:{redis_port}/0"
    _, port = processes.broker("--redis-url", url, "--redis-timeout", "1s")
    scanner = processes.scanner("--redis-url", url, "--redis-timeout", "1s")
    jobs = processes.jobs("--redis-url", url)
    api = Api(port, processes.http_ports[port])

    consumer = Wire(port)
    consumer.identify(msg_timeout=1000)
    assert consumer.sub("t", "c", rdy=5) == (FRAME_RESPONSE, b"OK")
    assert publish_until_ok(port, "t", b"held") == (FRAME_RESPONSE, b"OK")
    _, attempts, _, body = consumer.message()
    assert (attempts, body) == (1, b"held")       # not FINed: times out during the outage

    server["proc"].send_signal(signal.SIGSTOP)      # Redis hangs
    try:
        producer = Wire(port, timeout=10)
        started = time.monotonic()
        assert producer.pub("t", b"during") == (
            FRAME_ERROR, b"E_PUB_FAILED PUB outcome unknown, it may have been published: "
                         b"no answer from redis within 1000ms")
        assert time.monotonic() - started < 3.0
        assert producer.closed()
        started = time.monotonic()
        status, text, _ = api.request("GET", "/ping")
        assert (status, text[:6]) == (500, b"NOK - ")
        assert time.monotonic() - started < 3.0
        assert api.json("POST", "/pub?topic=t", b"x") == (     # behind the PUB's pipeline
            503, {"message": "no answer from redis within 1000ms (not sent)"})
    finally:
        server["proc"].send_signal(signal.SIGCONT)

    server["proc"].send_signal(signal.SIGKILL)      # and then crashes
    server["proc"].wait()
    assert Wire(port).pub("t", b"down")[0] == FRAME_ERROR
    time.sleep(1.5)
    restart()

    assert publish_until_ok(port, "t", b"after") == (FRAME_RESPONSE, b"OK")
    got = set()
    while not {(1, b"after"), (2, b"held")} <= got:
        got.add(consumer.message()[1:4:2])
    # "during" timed out, but Redis ran it once it was resumed: a timed-out PUB is
    # ambiguous, as its answer says (so clients retry: at least once); "down" met a
    # closed port: never ran
    assert got - {(1, b"during")} == {(1, b"after"), (2, b"held")}
    assert api.request("GET", "/ping")[:2] == (200, b"OK")
    assert not consumer.closed(timeout=0.5)
    assert scanner.poll() is None
    job = rq.Queue(JOBS_QUEUE, connection=redis.Redis.from_url(url)).enqueue(len, "abc")
    wait_for(lambda: job.get_status() == "finished", timeout=15, interval=0.2)
    assert (job.get_status(), job.return_value(), jobs.poll()) == ("finished", 3, None)


def test_every_publish_to_a_hung_redis_is_refused_within_the_timeout(processes, own_redis):
    """Producers at once, each PUBlishing again on a new connection after a refusal: a
    PUB queued behind another's wait for Redis, or behind a read of the topic's
    partitions, is refused within --redis-timeout all the same."""
    redis_port, server, _ = own_redis
    _, port = processes.broker("--redis-url", f"redis://127.0.0.1:{redis_port}/0",
                               "--redis-timeout", "1s")
    assert publish_until_ok(port, "t", b"before") == (FRAME_RESPONSE, b"OK")
    answers = []

    def produce():
        for _ in range(3):
            started = time.monotonic()
            producer = Wire(port, timeout=10)
            reply = producer.pub("t", b"during")
            answers.append((reply[0], reply[1][:len(b"E_PUB_FAILED")],
                            time.monotonic() - started))
            producer.close()

    server["proc"].send_signal(signal.SIGSTOP)
    try:
        producers = [threading.Thread(target=produce) for _ in range(6)]
        for t in producers:
            t.start()
        for t in producers:
            t.join(60)
    finally:
        server["proc"].send_signal(signal.SIGCONT)
    assert {answer[:2] for answer in answers} == {(FRAME_ERROR, b"E_PUB_FAILED")}
    assert len(answers) == 18
    assert max(took for _, _, took in answers) < 1.8  # not behind another's 1 s wait


def test_ping_and_pub_say_why_when_redis_went_away(processes, own_redis):
    redis_port, server, _ = own_redis
    _, port = processes.broker("--redis-url", f"redis://127.0.0.1:{redis_port}/0")
    api = Api(port, processes.http_ports[port])
    assert api.request("GET", "/ping")[:2] == (200, b"OK")
    server["proc"].kill()
    server["proc"].wait()
    status, data, _ = api.request("GET", "/ping")
    assert (status, data) == (500, f"NOK - Error 111 connecting to 127.0.0.1:{redis_port}. "
                                   "Connection refused.".encode())
    status, data = api.json("POST", "/pub?topic=t", b"x")     # why, not nsqd's EXITING
    assert (status, data) == (503, {"message": f"Error 111 connecting to 127.0.0.1:"
                                               f"{redis_port}. Connection refused."})
