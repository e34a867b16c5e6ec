"""Many connections on one broker: 2,000 idle ones with heartbeats while others work,
and clean refusals past the open-file limit."""

import json
import os
import resource
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from relay import embedded
from tests.helpers.api import Api
from tests.helpers.wait import wait_for
from tests.helpers.wire import FRAME_RESPONSE, Wire

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

HEARTBEAT = b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"


def idle_connection(port, heartbeat_ms=1000):
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    body = json.dumps({"heartbeat_interval": heartbeat_ms}).encode()
    sock.sendall(b"  V2IDENTIFY\n" + struct.pack(">i", len(body)) + body)
    assert sock.recv(10) == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    sock.setblocking(False)
    return sock


class HeartbeatAnswerer(threading.Thread):
    """Answers every heartbeat with NOP, as a client library does; counts them. A socket
    is answered from when it is added: a connection made while others are still being
    made (2,000 took over 2 s beside a busy core) must answer at once, as a client
    library's does, or the broker rightly closes it after two heartbeats."""

    def __init__(self):
        super().__init__(daemon=True)
        self.selector = selectors.DefaultSelector()
        self.beats = {}
        self.closed = set()
        self.stop = threading.Event()

    def add(self, sock):
        self.beats[sock] = 0
        self.selector.register(sock, selectors.EVENT_READ)
        return sock

    def run(self):
        while not self.stop.is_set():
            for key, _ in self.selector.select(0.1):
                sock = key.fileobj
                data = sock.recv(4096)
                if not data:
                    self.selector.unregister(sock)
                    self.closed.add(sock)
                    continue
                n = data.count(HEARTBEAT)
                self.beats[sock] += n
                sock.sendall(b"NOP\n" * n)


def test_two_thousand_idle_connections_while_others_work(processes):
    proc, port = processes.broker()
    processes.scanner()
    answerer = HeartbeatAnswerer()
    answerer.start()
    idle = [answerer.add(idle_connection(port)) for _ in range(2000)]

    api = Api(port, processes.http_ports[port])
    consumer = Wire(port)
    consumer.identify()
    assert consumer.sub("t", "c", rdy=100) == (FRAME_RESPONSE, b"OK")
    producer = Wire(port)
    started = time.monotonic()
    for i in range(50):
        assert producer.mpub("t", [b"%d-%d" % (i, j) for j in range(100)]) == (
            FRAME_RESPONSE, b"OK")
    got = set()
    while len(got) < 5000:
        msg_id, body = consumer.message()[2:]
        got.add(body)
        consumer.command(b"FIN " + msg_id)
    time.sleep(max(0.0, 3.5 - (time.monotonic() - started)))
    answerer.stop.set()
    answerer.join()
    assert len(got) == 5000
    assert answerer.closed == set()
    assert min(answerer.beats.values()) >= 2
    assert api.json("GET", "/stats?format=json")[1]["health"] == "OK"
    for sock in idle:
        sock.close()
    assert proc.poll() is None


def waiting(pid: int) -> bool:
    """The process sleeps (in a gevent process: its loop waits for events, with no greenlet
    left to run), twice in a row 5 ms apart."""
    def state():
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    if state() != "S":
        return False
    time.sleep(0.005)
    return state() == "S"


def test_a_broker_stopped_past_two_heartbeats_closes_only_the_silent_client(processes):
    """A broker held up (here stopped, as a process starved of CPU is) for longer than
    two heartbeat intervals closes no client that answered its heartbeat, though the NOP
    still waits unread in the socket, nor one it had sent no heartbeat to answer yet; a
    client that left a heartbeat unanswered is closed as soon as the broker runs. The
    test's own steps before each client's deadline have a second or more to spare."""
    proc, port = processes.broker()
    answering, silent = Wire(port), Wire(port)
    for wire in (answering, silent):
        assert wire.identify(heartbeat_interval=2000) == (FRAME_RESPONSE, b"OK")
    for wire in (answering, silent):    # deadlines 2 s after these
        assert wire.frame(skip_heartbeats=False) == (FRAME_RESPONSE, b"_heartbeat_")
    unbeaten = Wire(port)     # its first heartbeat is due a second after the stop began
    assert unbeaten.identify(heartbeat_interval=1000) == (FRAME_RESPONSE, b"OK")
    # each reader waits for its next command: the stop comes after its deadline is set
    assert wait_for(lambda: waiting(proc.pid), 5, 0.001)
    proc.send_signal(signal.SIGSTOP)
    try:
        answering.send(b"NOP\n")
        answerer = HeartbeatAnswerer()      # answers from the broker's first moment on
        for wire in (answering, unbeaten):
            answerer.add(wire.sock)
        answerer.start()
        time.sleep(3.0)
    finally:
        proc.send_signal(signal.SIGCONT)
    resumed = time.monotonic()
    assert silent.closed(timeout=1.0)
    assert time.monotonic() - resumed < 1.0
    time.sleep(3.0)
    answerer.stop.set()
    answerer.join()
    assert answerer.closed == set()
    assert min(answerer.beats.values()) >= 2
    assert proc.poll() is None


def test_connections_past_the_open_file_limit_are_refused_cleanly(processes, tmp_path):
    port = embedded.free_port()

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))
    log = open(tmp_path / "broker.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "relay", "broker", "--tcp-address", f"127.0.0.1:{port}",
         "--http-address", "", "--lookupd-http-address", ""],
        env={**os.environ, "REDIS_URL": processes.redis_url}, preexec_fn=low_limit,
        stdout=log, stderr=subprocess.STDOUT)
    try:
        embedded.wait_for_port("127.0.0.1", port, proc)
        served = [idle_connection(port, 60_000) for _ in range(200 - 64 - 1)]
        producer = Wire(port)                   # the last place (64 files are reserved)
        assert producer.pub("t", b"still serving") == (FRAME_RESPONSE, b"OK")
        refused = Wire(port)
        assert refused.closed(timeout=2)        # closed at once
        assert producer.pub("t", b"and still") == (FRAME_RESPONSE, b"OK")
        served[0].close()
        time.sleep(1.0)
        again = Wire(port)                      # a freed place is usable again
        assert again.pub("t", b"again") == (FRAME_RESPONSE, b"OK")
        for sock in served[1:]:
            sock.close()
        assert proc.poll() is None
        log.flush()
        assert "refusing connections" in (tmp_path / "broker.log").read_text()
    finally:
        proc.terminate()
        proc.wait(15)


@pytest.mark.cluster
def test_a_burst_of_subs_and_pubs_to_many_new_topics_all_succeed(processes):
    """400 connections send SUB to 400 new topics (and as many PUBs) at the same moment:
    each gets OK. Each new topic's partition count is read from Redis, and a burst of
    more reads than the client's connection pool holds must wait for a connection, not
    fail ("Too many connections")."""
    _, port = processes.broker()
    count = 400
    wires = [Wire(port, timeout=20) for _ in range(count)]
    for i, wire in enumerate(wires):
        if i % 2:
            wire.command(b"SUB burst%d c" % i)
        else:
            wire.command(b"PUB burst%d" % i, b"hello")
    assert [w.frame() for w in wires] == [(FRAME_RESPONSE, b"OK")] * count
    for wire in wires:
        wire.close()
