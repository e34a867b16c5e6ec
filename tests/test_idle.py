"""An idle broker waits for wake-ups instead of polling Redis in a loop."""

import time
from types import SimpleNamespace

from relay.store.connection import connect
from relay.broker.wakeups import WakeupListener
from tests.helpers.store import subscribed
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


class LocalChannel:
    """What the wake-up listener tells one of a broker's channels."""

    name = "c"
    parts = [None]

    def __init__(self):
        self.told = []

    def messages_arrived(self, index=None):
        self.told.append(("look", index))

    def check(self, index, incarnation, empties):
        self.told.append(("check", index))


def test_the_once_a_second_read_looks_again_only_where_a_wake_up_was_missed(store):
    local = LocalChannel()
    listener = WakeupListener(SimpleNamespace(store=store, topics={"t": {"c": local}}))

    def told():
        out, local.told = local.told, []
        return out
    subscribed(store, "t", "c")
    listener.watch("t")
    listener.check_versions()               # new here: checked, and looks once
    assert told() == [("check", 0), ("look", 0)]
    store.publish("t", [b"1"])
    listener.received("t", b"1|")           # heard, in turn
    listener.check_versions()
    assert told() == [("look", 0)]
    store.publish("t", [b"2"])              # its wake-up lost
    store.publish("t", [b"3"])
    listener.received("t", b"3|")
    assert listener.versions["t"] == 1
    listener.check_versions()
    assert told() == [("look", 0), ("check", 0), ("look", 0)]
    assert listener.versions["t"] == 3
    listener.received("t", b"c")            # from a relay that sends no version
    listener.check_versions()
    assert told() == [("look", 0)]
