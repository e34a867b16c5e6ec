"""One TCP client's state on a broker (relay/broker/client.py), seen over the wire: its
RDY credit (set_ready, settled), CLS (start_close) and the msg_timeout it asked for."""

import json
import socket
import time

import pytest
import redis

from relay.codec import FRAME_ERROR
from relay.store.connection import connect
from tests.helpers.wire import FRAME_RESPONSE, Wire, subscribed

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

OK = (FRAME_RESPONSE, b"OK")
CLOSE_WAIT = (FRAME_RESPONSE, b"CLOSE_WAIT")


# -- RDY -----------------------------------------------------------------------------------


def test_rdy_limits_in_flight(broker):
    p = Wire(broker)
    bodies = [b"m%d" % i for i in range(5)]
    assert p.mpub("t", bodies) == OK
    c = subscribed(broker, "t", "ch", rdy=2)
    got = [c.message(), c.message()]
    assert c.nothing(1.0)
    c.command(b"FIN " + got[0][2])
    got.append(c.message())
    assert c.nothing(1.0)
    c.command("RDY 0")
    c.command(b"FIN " + got[1][2])
    c.command(b"FIN " + got[2][2])
    assert c.nothing(1.5)
    c.command("RDY 10")
    got += [c.message(), c.message()]
    assert c.nothing(1.0)
    assert sorted(m[3] for m in got) == bodies
    assert all(m[1] == 1 for m in got)  # attempts


def test_rdy_zero_stops_delivery(broker):
    c = subscribed(broker, "t", "ch", rdy=0)
    p = Wire(broker)
    assert p.pub("t", b"m") == OK
    assert c.nothing(1.5)
    c.command("RDY 1")
    assert c.message()[3] == b"m"


# -- replies answered late ----------------------------------------------------------------


def test_a_late_answer_keeps_its_place_among_the_replies(processes, redis_url):
    """A PUB is answered once Redis has, while the broker reads on (ProtocolV2._answer_later):
    with Redis holding its writes, the reply to a command behind the PUB still comes after
    the PUB's OK, and a client that half-closes after a PUB still gets its OK."""
    _, port = processes.broker()
    first, second = Wire(port), Wire(port)
    assert first.pub("t", b"warm") == OK and second.pub("t", b"warm") == OK
    client = connect(redis_url)
    if isinstance(client, redis.RedisCluster):      # writes wait, on every master
        client.client_pause(700, all=False, target_nodes=redis.RedisCluster.PRIMARIES)
    else:
        client.client_pause(700, all=False)
    first.command("PUB t", b"late")
    time.sleep(0.2)         # read, and waiting for Redis: the next command comes apart
    first.command("DPUB t -1", b"x")
    second.command("PUB t", b"late too")
    second.sock.shutdown(socket.SHUT_WR)
    assert first.frame() == OK
    assert first.frame() == (FRAME_ERROR, b"E_INVALID DPUB could not parse timeout -1")
    assert second.frame() == OK
    assert first.closed() and second.closed()


# -- CLS --------------------------------------------------------------------------------


def test_cls_stops_delivery_but_fin_still_works(broker):
    p = Wire(broker)
    assert p.pub("t", b"before") == OK
    c = subscribed(broker, "t", "ch", rdy=5)
    _, _, mid, body = c.message()
    assert body == b"before"
    c.command("CLS")
    assert c.frame() == CLOSE_WAIT
    assert p.pub("t", b"after") == OK
    assert c.nothing(1.5)
    c.command("RDY 5")  # ignored after CLS, no error
    c.command("RDY abc")  # even unparsable: nsqd returns before parsing when closing
    assert c.nothing(1.0)
    c.command(b"FIN " + mid)  # FIN of a message received before CLS: no error
    assert c.nothing(0.5)
    assert c.pub("other", b"x") == OK  # still usable
    c.close()
    # "before" was finished: only "after" is left for another consumer
    d = subscribed(broker, "t", "ch", rdy=5)
    assert d.message()[3] == b"after"
    assert d.nothing(1.0)


# -- IDENTIFY --------------------------------------------------------------------------


def test_identify_msg_timeout_applies_to_that_client(broker):
    """A raw client asks for msg_timeout 1000 ms (the broker default is 60 s)."""
    from tests.helpers.wire import Wire
    c = Wire(broker)
    frame_type, reply = c.identify(feature_negotiation=True, msg_timeout=1000)
    assert json.loads(reply)["msg_timeout"] == 1000
    c.sub("own-timeout", "c", rdy=1)
    published = time.monotonic()        # the delivery, and so its deadline, comes later
    Wire(broker).pub("own-timeout", b"x")
    first = c.message()
    second = c.message()
    assert (first[1], second[1], first[2] == second[2]) == (1, 2, True)
    assert 0.99 <= time.monotonic() - published < 5


def test_touch_never_holds_a_message_past_max_msg_timeout(processes):
    """nsqd's TouchMessage: a TOUCH pushes the deadline msg_timeout ahead, but never past
    delivery + --max-msg-timeout. Redis keeps no delivery time: the client's record of it
    caps the timeout its broker sends."""
    _, port = processes.broker("--msg-timeout", "1000", "--max-msg-timeout", "2000")
    processes.scanner()
    c = Wire(port)
    c.identify(msg_timeout=1000)
    assert c.sub("capped", "c", rdy=1) == OK
    Wire(port).pub("capped", b"x")
    first = c.message()
    delivered = time.monotonic()
    c.sock.settimeout(0.3)
    while True:     # TOUCH well before each 1 s deadline, until the message comes again
        try:
            again = c.message()
            break
        except TimeoutError:
            assert time.monotonic() - delivered < 3.0, "TOUCH held the message past the cap"
            c.command(b"TOUCH " + first[2])
    assert (again[1], again[2]) == (2, first[2])
    assert time.monotonic() - delivered >= 1.9
