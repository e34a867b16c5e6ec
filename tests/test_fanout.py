"""Wide fan-out (issue 57 item 4): one message to a topic of thousands of channels, each
with a consumer on this broker, is made visible in calls of WIDE_CHANNELS channels and
reaches them all in one deliver call per 100 channels (relay/broker/channel.py,
Deliveries), while another client's publishes stay served."""

import http.client
import re
import time

import pytest

from relay.store.data_path import WIDE_CHANNELS
from tests.helpers.consumers import Consumers
from tests.helpers.wire import Wire
from tests.helpers.witness import Witness

CHANNELS = 2000
MESSAGES = 3
# The targets: a message reaches 5,000 channels within 0.3 s, and the witness's slowest
# PUB stays within 0.2 s meanwhile. Neither is met (BENCHMARKS.md, beside nsqd): relay's
# broker spends about 0.25 ms per delivery and its FIN (nsqd 0.2, on more cores), and a
# wave of 2,000 FINs holds the witness behind it for up to 1 s (nsqd: 70 ms). What this
# test holds is the design that halved the first: a deliver call per 100 channels where
# there was one per channel (at most MOST_CALLS per message; one per channel fails it).
# The time bounds only catch a wake-up lost (the once-a-second catch-up then delivers)
# and a witness starved for seconds; a message reached 2,000 channels in 0.6-1.0 s here
# (1.5-1.8 s with one call per channel), the witness waited 0.7-1.0 s at worst.
MOST_CALLS = CHANNELS // 20
# and each message is made visible a slice of channels a call (lib/wide.lua), not to
# all of them in one call of 90 ms (at 5,000 channels) that every other client waits for
STEPS = -(-CHANNELS // WIDE_CHANNELS)
SLOWEST_REACH = 3.0
SLOWEST_PUB = 3.0


def script_calls(http_port: int, scripts: str) -> int:
    """The calls of the scripts matching `scripts` the broker made (/metrics)."""
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return sum(int(float(n)) for n in re.findall(
        rf'relay_redis_script_calls_total\{{script="(?:{scripts})"\}} (\S+)', text))


@pytest.mark.integration
def test_one_message_reaches_2000_channels_while_others_publish(processes):
    _, port = processes.broker()
    consumers = Consumers(port, ["wide"] * CHANNELS)
    try:
        http_port = processes.http_ports[port]
        calls = script_calls(http_port, "deliver|deliver_many")
        witness = Witness(port)
        producer, reached = Wire(port), []
        for n in range(MESSAGES):
            time.sleep(0.3)
            reached.append(consumers.time_publish(producer, "wide", b"m%d" % n, CHANNELS, 10))
        slowest_pub = witness.stop()
        assert [got for got, _ in reached] == [CHANNELS] * MESSAGES
        assert script_calls(http_port, "deliver|deliver_many") - calls <= MOST_CALLS * MESSAGES
        assert script_calls(http_port, "publish_step") == STEPS * MESSAGES
        assert max(took for _, took in reached) < SLOWEST_REACH, reached
        assert slowest_pub < SLOWEST_PUB
    finally:
        consumers.close()
