"""A channel's life across brokers on one Redis: deletes, empties and connections that
go away while deliveries are on their way (issue 16)."""

import time

import pytest

from relay.store import Store
from relay.store.connection import connect
from tests.helpers.api import Api
from tests.helpers.wait import wait_for
from tests.helpers.wire import FRAME_RESPONSE, Wire

pytestmark = pytest.mark.cluster     # on one Redis and on a cluster (tests/conftest.py)


def test_no_message_stays_in_flight_after_its_consumer_drops_the_connection(
        processes, redis_url):
    _, port = processes.broker()
    processes.scanner()
    store = Store(connect(redis_url))
    producer = Wire(port)
    for _ in range(5):
        assert producer.mpub("drop", [b"x" * 10] * 5000) == (FRAME_RESPONSE, b"OK")
    for attempt in range(3):
        consumer = Wire(port)
        consumer.identify(msg_timeout=60000)
        assert consumer.sub("drop", "c", rdy=2500) == (FRAME_RESPONSE, b"OK")
        for _ in range(3000):
            msg_id = consumer.message()[2]
            consumer.command(f"FIN {msg_id.decode()}")
        consumer.close()    # no CLS: the connection just goes
        assert wait_for(lambda: store.read_channel("drop", "c")["in_flight_count"] == 0,
                        2.0), (attempt, store.read_channel("drop", "c"))
    producer.close()


def test_empty_frees_a_live_consumers_credit_on_every_broker(processes, redis_url):
    _, port1 = processes.broker()
    _, port2 = processes.broker()
    processes.scanner()
    api = Api(port1, processes.http_ports[port1])
    producer = Wire(port1)
    assert producer.mpub("full", [b"old"] * 5) == (FRAME_RESPONSE, b"OK")
    consumer = Wire(port2)
    consumer.identify(msg_timeout=60000)
    assert consumer.sub("full", "c", rdy=5) == (FRAME_RESPONSE, b"OK")
    assert [consumer.message()[3] for _ in range(5)] == [b"old"] * 5
    time.sleep(1.0)     # a live consumer: broker 2 listens to the topic's wake-ups by now
    assert api.request("POST", "/channel/empty?topic=full&channel=c")[0] == 200
    assert producer.pub("full", b"new") == (FRAME_RESPONSE, b"OK")
    started = time.monotonic()
    assert consumer.message()[3] == b"new"
    assert time.monotonic() - started < 1.0
    status, stats = Api(port2, processes.http_ports[port2]).json(
        "GET", "/stats?format=json&topic=full&channel=c")
    channel = stats["topics"][0]["channels"][0]
    assert (channel["in_flight_count"], channel["clients"][0]["in_flight_count"]) == (1, 1)
    consumer.close()
    producer.close()


def test_delete_right_after_sub_on_another_broker_closes_the_consumer(processes):
    _, port1 = processes.broker()
    _, port2 = processes.broker()
    api = Api(port1, processes.http_ports[port1])
    for attempt in range(10):
        consumer = Wire(port2)
        consumer.identify()
        assert consumer.sub("gone", "c", rdy=1) == (FRAME_RESPONSE, b"OK")
        assert api.request("POST", "/channel/delete?topic=gone&channel=c")[0] == 200
        assert consumer.closed(timeout=2.0), attempt
        consumer.close()
