"""Innocent producers, each timing its publishes while an attack runs: one over TCP and
one over HTTP keep-alive."""

import http.client
import threading
import time

from tests.helpers.wire import FRAME_RESPONSE, Wire


class Witness(threading.Thread):
    """An innocent producer on its own connection: a PUB every 20 ms, each timed."""

    OK: tuple = (FRAME_RESPONSE, b"OK")

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.connect(port)
        # a broker's first publish loads its scripts: not what is measured here
        assert self.publish() == self.OK
        self.times: list[float] = []
        self.replies: set = set()
        self.done = threading.Event()
        self.start()

    def connect(self, port: int) -> None:
        self.wire = Wire(port, timeout=30)

    def publish(self):
        return self.wire.pub("witness", b"alive")

    def close(self) -> None:
        self.wire.close()

    def run(self):
        while not self.done.is_set():
            started = time.perf_counter()
            self.replies.add(self.publish())
            self.times.append(time.perf_counter() - started)
            time.sleep(0.02)

    def stop(self) -> float:
        """The slowest PUB; every PUB must have been answered OK."""
        self.done.set()
        self.join(30)
        self.close()
        assert self.replies == {self.OK}, self.replies
        assert len(self.times) >= 10, self.times
        return max(self.times)


class HttpWitness(Witness):
    """The same over one keep-alive HTTP connection: POST /pub."""

    OK = (200, b"OK")

    def connect(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def publish(self):
        self.conn.request("POST", "/pub?topic=witness", b"alive")
        response = self.conn.getresponse()
        return response.status, response.read()

    def close(self) -> None:
        self.conn.close()
