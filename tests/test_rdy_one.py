"""Consumers at RDY 1 (relay/broker/settling.py): a FIN that comes while its channel's
delivery loop waits for its call is held for the loop's next deliver call there, into
which the group commit folds it, so a message costs one script call, not a deliver and a
finish of its own (4 consumers at RDY 1: 0.62 finish calls a message before)."""

import socket
import threading
import time

import pytest

from relay.codec import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE
from tests.helpers.wire import Wire
from tests.test_fanout import script_calls

CONSUMERS = 4
MESSAGES = 400
# finish calls made alone: a FIN that came while the loop was idle and no deliver call
# followed it in the same pipeline (its channel drained, say); one per FIN fails it
MOST_ALONE = MESSAGES // 10


def consume(wire: Wire, got: list, errors: list) -> None:
    """FIN each message at once, until its connection is closed."""
    try:
        while True:
            frame_type, data = wire.frame()
            if frame_type == FRAME_MESSAGE:
                got.append(data[10:26])
                wire.send(b"FIN " + data[10:26] + b"\n")
            elif frame_type == FRAME_ERROR:
                errors.append(data)
    except OSError:
        pass


@pytest.mark.integration
def test_four_consumers_at_rdy_1_make_one_call_a_message(processes):
    _, port = processes.broker()
    http_port = processes.http_ports[port]
    wires = [Wire(port, timeout=30) for _ in range(CONSUMERS)]
    for wire in wires:
        assert wire.sub("r1", "c") == (FRAME_RESPONSE, b"OK")
    producer = Wire(port)
    for start in range(0, MESSAGES, 100):
        bodies = [b"m%d" % i for i in range(start, start + 100)]
        assert producer.mpub("r1", bodies) == (FRAME_RESPONSE, b"OK")
    before = script_calls(http_port, "finish|finish_many")
    got: list = []
    errors: list = []
    threads = [threading.Thread(target=consume, args=(wire, got, errors), daemon=True)
               for wire in wires]
    for thread in threads:
        thread.start()
    for wire in wires:
        wire.send(b"RDY 1\n")
    try:
        deadline = time.monotonic() + 30
        while len(got) < MESSAGES and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)     # the last FINs sent
        assert (len(got), len(set(got)), errors) == (MESSAGES, MESSAGES, [])
        assert script_calls(http_port, "finish|finish_many") - before <= MOST_ALONE
    finally:
        for wire in wires:
            wire.sock.shutdown(socket.SHUT_RDWR)    # its reader wakes and ends
            wire.sock.close()
        for thread in threads:
            thread.join(5)
        producer.sock.close()
