"""A channel on a broker (relay/broker/channel.py): its life across brokers on one Redis
(deletes, empties and connections that go away while deliveries are on their way,
issue 16), and its delivery loop, which waits for news once the channel is drained."""

import time

import pytest

from relay.store import Store
from relay.store.connection import connect
from tests.helpers.api import Api
from tests.helpers.wait import wait_for
from tests.helpers.wire import FRAME_RESPONSE, Wire

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out


@pytest.mark.cluster     # on one Redis and on a cluster (tests/conftest.py)
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
        assert wait_for(lambda: store.reads.read_channel("drop", "c")["in_flight_count"] == 0,
                        2.0), (attempt, store.reads.read_channel("drop", "c"))
    producer.close()


@pytest.mark.cluster     # on one Redis and on a cluster (tests/conftest.py)
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


@pytest.mark.cluster     # on one Redis and on a cluster (tests/conftest.py)
def test_delete_right_after_sub_on_another_broker_closes_the_consumer(processes):
    _, port1 = processes.broker()
    _, port2 = processes.broker()
    api = Api(port1, processes.http_ports[port1])
    for attempt in range(10):
        consumer = Wire(port2)
        consumer.identify()
        assert consumer.sub("gone", "c", rdy=1) == (FRAME_RESPONSE, b"OK")
        assert api.request("POST", "/channel/delete?topic=gone&channel=c")[0] == 200
        assert consumer.closed(timeout=5.0), attempt
        consumer.close()


def lpops(client) -> int:
    """deliver.lua's pops: one LPOP (at least) per deliver call."""
    return client.info("commandstats").get("cmdstat_lpop", {}).get("calls", 0)


def test_a_consumer_that_drained_its_channel_waits_for_news_instead_of_asking(
        processes, redis_url):
    """At RDY 1 each message costs one deliver call: a FIN that frees the credit of a
    channel whose last deliver said the queue was empty does not ask Redis again."""
    _, port = processes.broker()
    consumer = Wire(port)
    assert consumer.sub("drained", "c", rdy=1) == (0, b"OK")
    producer = Wire(port)
    client = connect(redis_url)
    time.sleep(1.5)  # past the first read of the new channel's topic
    before = lpops(client)
    for i in range(10):
        assert producer.pub("drained", b"%d" % i) == (0, b"OK")
        _, _, msg_id, body = consumer.message()
        assert body == b"%d" % i
        consumer.command(b"FIN " + msg_id)
        time.sleep(0.05)  # what the FIN sets off happens before the next PUB
    time.sleep(1.5)  # past another read of the versions
    # one more if a versions read fell between a publish and its wake-up (then that
    # version looks missed); asking after every FIN would make it 20
    assert lpops(client) - before in (10, 11)
