"""An idle broker waits for wake-ups instead of polling Redis in a loop."""

import time

from relay.store.connection import connect

from tests.helpers.wire import Wire


def commands_run(client) -> int:
    """Every command Redis ran (a script's own calls too), but the INFO calls that
    read this."""
    stats = client.info("all")
    return stats["total_commands_processed"] - stats["cmdstat_info"]["calls"]


def test_idle_broker_with_a_waiting_consumer_barely_touches_redis(processes, redis_url):
    _, port = processes.broker()
    consumer = Wire(port)
    assert consumer.sub("quiet", "c", rdy=10) == (0, b"OK")
    client = connect(redis_url)
    time.sleep(2.0)  # past the first catch-up read, whose Store loads the scripts once
    before = commands_run(client)
    time.sleep(3.0)
    during = commands_run(client) - before
    # the only traffic is the once-a-second read of the topics' versions: one script
    # that runs a command per topic
    assert during <= 4 * 2, during
    producer = Wire(port)
    assert producer.pub("quiet", b"wake up") == (0, b"OK")
    assert consumer.message()[3] == b"wake up"
