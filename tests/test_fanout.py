"""Wide fan-out (issue 57 item 4): one message to a topic of thousands of channels, each
with a consumer on this broker, reaches them all in one deliver call per 100 channels
(relay/broker/channel.py, Deliveries), while another client's publishes stay served."""

import http.client
import re
import resource
import selectors
import socket
import struct
import time

import pytest

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
SLOWEST_REACH = 3.0
SLOWEST_PUB = 3.0


class Consumers:
    """CHANNELS consumers at RDY 1, one per channel of topic "wide", read from one
    selector: each FINs what it gets."""

    def __init__(self, port: int):
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        self.selector = selectors.DefaultSelector()
        self.buffers: dict[socket.socket, bytes] = {}
        for i in range(CHANNELS):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"  V2" + f"SUB wide c{i}\nRDY 1\n".encode())
            self.buffers[sock] = b""
            self.selector.register(sock, selectors.EVENT_READ)
        oks = 0
        while oks < CHANNELS:
            oks += sum(1 for kind, _ in self._frames(10) if kind == 0)

    def _frames(self, timeout: float) -> list[tuple[int, bytes]]:
        """(frame type, payload) of what arrived within `timeout`; messages FINned."""
        out = []
        for key, _ in self.selector.select(timeout):
            sock = key.fileobj
            data = sock.recv(65536)
            assert data, "the broker closed a consumer"
            buffer = self.buffers[sock] + data
            while len(buffer) >= 8:
                size, kind = struct.unpack(">ii", buffer[:8])
                if len(buffer) < 4 + size:
                    break
                payload, buffer = buffer[8:4 + size], buffer[4 + size:]
                if kind == 2:
                    sock.sendall(b"FIN " + payload[10:26] + b"\n")
                out.append((kind, payload))
            self.buffers[sock] = buffer
        return out

    def receive(self, body: bytes, within: float) -> int:
        """How many consumers got `body` within `within` seconds."""
        got, until = 0, time.monotonic() + within
        while got < CHANNELS and time.monotonic() < until:
            got += sum(1 for kind, payload in self._frames(0.1)
                       if kind == 2 and payload[26:] == body)
        return got

    def close(self) -> None:
        for sock in self.buffers:
            sock.close()


def deliver_calls(http_port: int) -> int:
    """The deliver and deliver_many calls the broker made (/metrics)."""
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return sum(int(float(n)) for n in re.findall(
        r'relay_redis_script_calls_total\{script="deliver(?:_many)?"\} (\S+)', text))


@pytest.mark.integration
def test_one_message_reaches_2000_channels_while_others_publish(processes):
    _, port = processes.broker()
    consumers = Consumers(port)
    try:
        calls = deliver_calls(processes.http_ports[port])
        witness = Witness(port)
        producer = socket.create_connection(("127.0.0.1", port))
        producer.sendall(b"  V2")
        reached = []
        for n in range(MESSAGES):
            time.sleep(0.3)
            body = b"m%d" % n
            started = time.monotonic()
            producer.sendall(b"PUB wide\n" + struct.pack(">i", len(body)) + body)
            got = consumers.receive(body, 10)
            reached.append((got, time.monotonic() - started))
        slowest_pub = witness.stop()
        assert [got for got, _ in reached] == [CHANNELS] * MESSAGES
        assert deliver_calls(processes.http_ports[port]) - calls <= MOST_CALLS * MESSAGES
        assert max(took for _, took in reached) < SLOWEST_REACH, reached
        assert slowest_pub < SLOWEST_PUB
    finally:
        consumers.close()
