"""A consumer that stops reading its socket: bounded broker memory, others unaffected,
its messages redelivered after their timeout, and the connection closed."""

import socket
import threading
import time

import pytest

from tests.helpers.api import Api
from tests.helpers.processes import rss_kb
from tests.helpers.wait import wait_until
from tests.helpers.wire import FRAME_RESPONSE, Wire

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

BODY = 100 * 1024


def stuck_consumer(port):
    """SUB with RDY 2500, a tiny receive buffer, then never read; NOP to look alive."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"  V2" + b"SUB t c\n")
    sock.settimeout(5)
    assert sock.recv(10) == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    sock.sendall(b"RDY 2500\n")
    alive = threading.Event()

    def nop():
        while not alive.wait(0.5):
            try:
                sock.sendall(b"NOP\n")
            except OSError:
                return
    threading.Thread(target=nop, daemon=True).start()
    return sock, alive


def test_a_stuck_consumer_costs_bounded_memory_and_slows_nobody(processes):
    proc, port = processes.broker("--client-timeout", "4s", "--msg-timeout", "2s")
    processes.scanner()
    api = Api(port, processes.http_ports[port])
    assert api.request("POST", "/topic/create?topic=t")[0] == 200
    stuck, alive = stuck_consumer(port)
    time.sleep(0.2)
    before = rss_kb(proc.pid)
    bodies = [b"%06d" % i + b"x" * (BODY - 6) for i in range(600)]
    for i in range(0, 600, 40):
        assert api.request("POST", "/mpub?topic=t", b"\n".join(bodies[i:i + 40]))[0] == 200

    good = Wire(port, timeout=20)
    good.identify()
    assert good.sub("t", "c", rdy=10) == (FRAME_RESPONSE, b"OK")
    got = set()
    started = time.monotonic()
    while len(got) < 600:
        msg_id, body = good.message()[2:]
        got.add(body[:6])
        good.command(b"FIN " + msg_id)
    assert got == {b[:6] for b in bodies}
    assert time.monotonic() - started < 20
    # 60 MB published; without the bound the stuck consumer's backlog alone is all of
    # it (measured: +72 MB, vs +24 MB with it, most of that the 4 MB HTTP bodies)
    assert rss_kb(proc.pid) - before < 45_000

    _, stats = wait_until(
        lambda: api.json("GET", "/stats?format=json"),
        lambda reply: len(reply[1]["topics"][0]["channels"][0]["clients"]) <= 1,
        timeout=10, interval=0.2)
    assert len(stats["topics"][0]["channels"][0]["clients"]) == 1   # the stuck one is closed
    assert stats["topics"][0]["channels"][0]["timeout_count"] > 0
    alive.set()
    stuck.close()
    good.close()
