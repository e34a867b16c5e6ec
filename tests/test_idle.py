"""An idle broker waits for wake-ups instead of polling Redis in a loop."""

import time

from relay.store.connection import connect
from tests.helpers.wire import Wire


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
