"""`relay broker --workers N`: N broker processes on one set of ports, under a parent
that stops them on SIGTERM and replaces one that dies."""

import json
import os
import signal
import subprocess
import sys

import pytest

from relay.store import keys
from relay.store.connection import connect
from tests.helpers.gnsq_clients import round_trip
from tests.helpers.processes import listening_ports
from tests.helpers.servers import flush
from tests.helpers.wait import wait_for
from tests.helpers.wire import subscribed

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
    assert listening_ports(proc.pid) == set()  # the parent holds the ports, takes nothing

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

