"""An idle broker waits for wake-ups instead of polling Redis in a loop."""

import time

from relay.store.connection import connect

from tests.wire import Wire


def script_calls(client):
    return client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


def test_idle_broker_with_a_waiting_consumer_barely_touches_redis(processes, redis_url):
    _, port = processes.broker()
    consumer = Wire(port)
    assert consumer.sub("quiet", "c", rdy=10) == (0, b"OK")
    client = connect(redis_url)
    time.sleep(0.5)
    before = script_calls(client)
    time.sleep(3.0)
    during = script_calls(client) - before
    # the only traffic is the once-a-second read of the topics' versions
    assert during <= 4, during
    producer = Wire(port)
    assert producer.pub("quiet", b"wake up") == (0, b"OK")
    assert consumer.message()[3] == b"wake up"
