"""`relay broker --workers N`: N broker processes on one set of ports, under a parent
that stops them on SIGTERM, replaces one that dies, and restarts them one at a time on
SIGHUP (re-executing itself first)."""

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from relay.store import keys
from relay.store.connection import connect
from tests.helpers.gnsq_clients import consumer, round_trip, stop
from tests.helpers.processes import listening_ports
from tests.helpers.servers import flush
from tests.helpers.wait import wait_for
from tests.helpers.wire import Wire, subscribed

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out


@pytest.fixture
def parent(single_redis_url, tmp_path):
    """Starts `relay broker --workers N ARGS` on free ports (port 0) and waits until its
    startup line and its N workers' registrations; the parent process (its log in `.log`)."""
    flush(single_redis_url)
    procs = []

    def start(workers, *args):
        log = open(tmp_path / f"broker-{len(procs)}.log", "w+")
        proc = subprocess.Popen(
            [sys.executable, "-m", "relay", "broker", "--workers", str(workers),
             "--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", *args],
            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "REDIS_URL": single_redis_url})
        proc.log = log
        procs.append(proc)
        assert wait_for(lambda: f"broker with {workers} workers" in log_text(proc) and
                        registered_pids(single_redis_url) == set(worker_pids(proc)),
                        timeout=20), log_text(proc)
        return proc

    yield start
    for proc in procs:  # the parent exits once its workers have
        workers = worker_pids(proc)
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            for pid in [proc.pid, *workers]:
                os.kill(pid, signal.SIGKILL)
            raise


def worker_pids(proc) -> list[int]:
    """The pids of the parent's children, its workers."""
    try:
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            return [int(pid) for pid in f.read().split()]
    except FileNotFoundError:
        return []


def registered_pids(redis_url) -> set[int]:
    """The pids of the brokers in the registry (a broker id is HOSTNAME-PID-RANDOM)."""
    return {int(broker.decode().rsplit("-", 2)[1])
            for broker in connect(redis_url).zrange(keys.BROKERS, 0, -1)}


def announced_clients(redis_url) -> dict[str, int]:
    """Broker id -> how many subscribed clients it announced in the registry."""
    redis = connect(redis_url)
    return {broker.decode(): len(json.loads(redis.get(keys.broker_clients_key(broker.decode()))
                                            or "[]"))
            for broker in redis.zrange(keys.BROKERS, 0, -1)}


def log_text(proc) -> str:
    proc.log.seek(0)
    return proc.log.read()


def shared_ports(proc) -> tuple[int, int]:
    """(tcp, http) of the parent's startup line."""
    line = next(line for line in log_text(proc).splitlines() if "workers" in line)
    ports = dict(part.split("=") for part in line.rstrip('"').split(" on ")[1].split())
    return tuple(int(ports[name].rpartition(":")[2]) for name in ("tcp", "http"))


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_two_workers_share_port_0_and_clients_reach_both(parent, single_redis_url):
    proc = parent(2)
    tcp, http = shared_ports(proc)
    for pid in worker_pids(proc):
        assert listening_ports(pid) == {tcp, http}
    # the parent keeps each worker's listener (it accepts nothing on it), so a worker's
    # successor takes over its accept queue
    assert listening_ports(proc.pid) == {tcp, http}

    wires = [subscribed(tcp, "spread", "c") for _ in range(16)]
    assert wait_for(lambda: sum(announced_clients(single_redis_url).values()) == 16)
    assert min(announced_clients(single_redis_url).values()) > 0
    for wire in wires:
        wire.close()

    assert round_trip(tcp, "spread", 50) == sorted(b"%d" % i for i in range(50))


def test_sigterm_stops_every_worker(parent, single_redis_url):
    proc = parent(2)
    workers = worker_pids(proc)
    tcp, _ = shared_ports(proc)
    wires = [subscribed(tcp, "leaving", "c") for _ in range(4)]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0, log_text(proc)
    assert all(gone(pid) for pid in workers)
    assert all(wire.closed(timeout=1) for wire in wires)
    assert registered_pids(single_redis_url) == set()
    assert log_text(proc).count(" stopping (tcp=") == 2


def test_a_worker_killed_with_9_is_replaced(parent, single_redis_url):
    proc = parent(2)
    killed, kept = worker_pids(proc)
    os.kill(killed, signal.SIGKILL)
    assert wait_for(lambda: len(worker_pids(proc)) == 2 and killed not in worker_pids(proc),
                    timeout=10)
    replacement = (set(worker_pids(proc)) - {kept}).pop()
    assert wait_for(lambda: replacement in registered_pids(single_redis_url))
    assert f"(pid {killed}) exited with signal SIGKILL; starting another" in log_text(proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0


def test_workers_die_with_a_parent_killed_with_9(parent):
    proc = parent(2)
    workers = worker_pids(proc)
    proc.kill()
    proc.wait(5)
    stopped = wait_for(lambda: all(gone(pid) for pid in workers), timeout=15)
    for pid in [pid for pid in workers if not gone(pid)]:
        os.kill(pid, signal.SIGKILL)  # none left unless the test fails
    assert stopped


def test_a_worker_that_cannot_start_stops_the_broker_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "relay", "broker", "--workers", "2", "--tcp-address",
         "127.0.0.1:0", "--http-address", "", "--tls-cert", "server.pem", "--tls-key",
         "server.key"], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stderr) == (
        2, "relay: --tls-cert server.pem: No such file or directory\n")



class Publishers:
    """Threads publishing b"tcp-N" (PUB, on a new connection each) and b"http-N" (POST
    /pub, on a new connection each) to `topic` until stopped: the bodies acknowledged, and
    each failure (a refused or reset connection, an answer other than OK)."""

    def __init__(self, tcp: int, http: int, topic: str, each: int = 2):
        self.tcp, self.http, self.topic = tcp, http, topic
        self.acked: list[bytes] = []
        self.failures: list[str] = []
        self.running = True
        self.threads = [threading.Thread(target=self._publish, args=(kind, f"{kind}{n}"))
                        for kind in ("tcp", "http") for n in range(each)]
        for thread in self.threads:
            thread.start()

    def _publish(self, kind: str, name: str) -> None:
        n = 0
        while self.running:
            body = f"{name}-{n}".encode()
            n += 1
            try:
                ok = self._tcp(body) if kind == "tcp" else self._http(body)
            except OSError as e:
                ok = f"{type(e).__name__}: {e}"
            if ok is True:
                self.acked.append(body)
            else:
                self.failures.append(f"{body.decode()}: {ok}")
            time.sleep(0.002)

    def _tcp(self, body: bytes):
        wire = Wire(self.tcp)
        try:
            reply = wire.pub(self.topic, body)
        except EOFError as e:
            return f"EOF: {e}"
        finally:
            wire.sock.close()
        return reply == (0, b"OK") or repr(reply)

    def _http(self, body: bytes):
        conn = http.client.HTTPConnection("127.0.0.1", self.http, timeout=5)
        try:
            conn.request("POST", f"/pub?topic={self.topic}", body)
            response = conn.getresponse()
            return (response.status, response.read()) == (200, b"OK") or response.status
        finally:
            conn.close()

    def stop(self) -> None:
        self.running = False
        for thread in self.threads:
            thread.join(10)


def test_sighup_replaces_every_worker_with_no_publish_lost_or_refused(parent, single_redis_url):
    proc = parent(4)
    tcp, http_port = shared_ports(proc)
    old = set(worker_pids(proc))
    for path in ("/topic/create?topic=roll", "/channel/create?topic=roll&channel=c"):
        conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=5)
        conn.request("POST", path)
        assert conn.getresponse().status == 200
        conn.close()

    publishers = Publishers(tcp, http_port, "roll")
    try:
        assert wait_for(lambda: len(publishers.acked) > 50)
        before = len(publishers.acked)
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: len(worker_pids(proc)) == 4 and not old & set(worker_pids(proc))
                        and registered_pids(single_redis_url) == set(worker_pids(proc)),
                        timeout=30), log_text(proc)
        during = len(publishers.acked) - before
        assert wait_for(lambda: len(publishers.acked) > before + during + 50)
    finally:
        publishers.stop()

    assert publishers.failures == []
    assert during > 100     # publishing went on throughout the restart
    assert proc.poll() is None and log_text(proc).count("broker re-executed (pid "
                                                        f"{proc.pid})") == 1
    assert log_text(proc).count("; starting another") == 0
    assert "rolling restart done: 4 workers replaced" in log_text(proc)
    for pid in worker_pids(proc):
        assert listening_ports(pid) == {tcp, http_port}

    got: list[bytes] = []
    c = consumer(tcp, "roll", "c", lambda m: (got.append(m.body), m.finish()),
                 max_in_flight=200)
    assert wait_for(lambda: len(got) >= len(publishers.acked), timeout=20)
    stop(c)
    assert sorted(got) == sorted(publishers.acked)


def test_sigterm_during_a_rolling_restart_stops_everything(parent, single_redis_url):
    proc = parent(4)
    old = worker_pids(proc)
    proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "broker worker 1 replaced" in log_text(proc), timeout=30), \
        log_text(proc)
    workers = set(old) | set(worker_pids(proc))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0, log_text(proc)
    assert all(gone(pid) for pid in workers)
    assert registered_pids(single_redis_url) == set()
    assert "rolling restart done" not in log_text(proc)


def test_sighup_with_options_the_broker_would_refuse_keeps_the_workers(parent, tmp_path):
    """As a reload of nginx: options the new broker would refuse leave the old workers
    serving, with one error line."""
    (tmp_path / "relay.toml").write_text('msg_timeout = "60s"\n')
    proc = parent(2, "--config", "relay.toml")
    old = worker_pids(proc)
    (tmp_path / "relay.toml").write_text('msg_timeout = "soon"\n')
    proc.send_signal(signal.SIGHUP)
    refused = ("SIGHUP: not restarting, the broker on disk would not start with these "
               "options: relay: invalid msg_timeout: not a duration: 'soon' (use e.g. "
               "250ms, 60s, 15m, 1h)")
    assert wait_for(lambda: refused in log_text(proc), timeout=30), log_text(proc)
    assert (proc.poll(), worker_pids(proc)) == (None, old)
    tcp, _ = shared_ports(proc)
    assert Wire(tcp).pub("t", b"still served") == (0, b"OK")


def test_connections_queued_on_a_stuck_worker_are_served_by_its_replacement(parent):
    """The old worker's accept queue is its replacement's: connections the kernel put
    there while the old one could not take them are answered by the new one."""
    proc = parent(4)
    tcp, _ = shared_ports(proc)
    first = int(next(line for line in log_text(proc).splitlines() if "workers (pids" in line)
                .split("(pids ")[1].split(",")[0])     # worker 1's
    os.kill(first, signal.SIGSTOP)
    answers: list = []

    def publish(n):
        try:
            wire = Wire(tcp, timeout=20)
            answers.append(wire.pub("queued", b"%d" % n))
            wire.sock.close()
        except OSError as e:
            answers.append(repr(e))

    try:
        threads = [threading.Thread(target=publish, args=(n,)) for n in range(40)]
        for thread in threads:
            thread.start()
        assert wait_for(lambda: 20 <= len(answers) < 40)   # some wait on worker 1's queue
        proc.send_signal(signal.SIGHUP)
        # answered by worker 1's successor while worker 1 is still stopped
        assert wait_for(lambda: len(answers) == 40, timeout=15), log_text(proc)
    finally:
        os.kill(first, signal.SIGCONT)
    for thread in threads:
        thread.join(10)
    assert answers == [(0, b"OK")] * 40
    assert wait_for(lambda: "rolling restart done: 4 workers replaced" in log_text(proc),
                    timeout=15), log_text(proc)


def test_a_connection_accepted_before_a_stop_gets_its_answer(parent):
    """A stop lets a connection that is not a consumer end by itself (up to a second):
    a client that connected just before it, as during a rolling restart, is answered."""
    proc = parent(2)
    tcp, _ = shared_ports(proc)
    wire = Wire(tcp)        # accepted by a worker; its PUB comes after the stop
    assert wire.pub("late", b"before") == (0, b"OK")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert wire.pub("late", b"after") == (0, b"OK")
    assert wire.closed(timeout=3)
    assert proc.wait(15) == 0
