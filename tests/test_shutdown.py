"""SIGTERM: the broker drains its consumers, requeues what they keep, leaves the
registry and exits in bounded time; the scanner stops between passes; the jobs worker
stops its rq worker."""

import os
import signal
import subprocess
import sys
import time

import pytest

from relay.codec import CLOSE_WAIT
from relay.store import keys
from relay.store.connection import connect
from workers import operations
from workers.jobs import run_worker
from tests.helpers.api import Api
from tests.helpers.wait import wait_for
from tests.helpers.wire import FRAME_RESPONSE, Wire

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out


def test_sigterm_drains_consumers_then_requeues_what_they_keep(processes):
    leaving, port1 = processes.broker("--broadcast-address", "127.0.0.1")
    _, port2 = processes.broker("--broadcast-address", "127.0.0.1")
    api = Api(port2, processes.http_ports[port2])
    assert api.request("POST", "/topic/create?topic=t")[0] == 200
    assert api.request("POST", "/channel/create?topic=t&channel=c")[0] == 200
    assert api.request("POST", "/mpub?topic=t", b"finished\nkept")[0] == 200

    finisher, keeper = Wire(port1), Wire(port1)
    for wire in (finisher, keeper):
        wire.identify()
        assert wire.sub("t", "c", rdy=1) == (FRAME_RESPONSE, b"OK")
    held = {wire: wire.message() for wire in (finisher, keeper)}
    assert sorted(m[3] for m in held.values()) == [b"finished", b"kept"]

    started = time.monotonic()
    leaving.send_signal(signal.SIGTERM)
    for wire in (finisher, keeper):
        assert wire.frame() == (FRAME_RESPONSE, CLOSE_WAIT)
    finisher.command(b"FIN " + held[finisher][2])
    assert finisher.closed(timeout=2)      # as soon as it holds nothing
    assert not keeper.closed(timeout=1)
    assert keeper.closed(timeout=10)       # after the grace period (5 s)
    assert leaving.wait(15) == 0
    assert time.monotonic() - started < 12

    assert [p["tcp_port"] for p in api.json("GET", "/lookup?topic=t")[1]["producers"]] \
        == [port2]
    other = Wire(port2)
    other.identify()
    assert other.sub("t", "c", rdy=5) == (FRAME_RESPONSE, b"OK")
    _, attempts, _, body = other.message()       # at once, not after msg_timeout (60 s)
    assert (attempts, body) == (2, held[keeper][3])
    assert other.nothing(0.5)
    _, stats = api.json("GET", "/stats?format=json")
    channel = stats["topics"][0]["channels"][0]
    assert (channel["requeue_count"], channel["in_flight_count"], channel["depth"]) == (1, 1, 0)


def test_sigterm_stops_the_scanner(processes):
    scanner = processes.scanner()
    connection = connect(processes.redis_url)
    # registered: its first pass ran, after its signal handlers
    wait_for(lambda: connection.zcard(keys.SCANNERS), timeout=15, interval=0.05)
    assert connection.zcard(keys.SCANNERS) == 1
    started = time.monotonic()
    scanner.send_signal(signal.SIGTERM)
    assert scanner.wait(5) == 0
    assert time.monotonic() - started < 2


def test_sigterm_stops_the_jobs_worker_and_its_rq_worker(processes):
    jobs = processes.jobs()
    connection = connect(processes.redis_url)
    wait_for(lambda: operations.has_worker(connection), timeout=15, interval=0.1)
    assert operations.has_worker(connection)
    jobs.send_signal(signal.SIGTERM)
    assert jobs.wait(10) == 0
    wait_for(lambda: not operations.has_worker(connection), timeout=5, interval=0.1)
    assert not operations.has_worker(connection)     # the rq worker left too


def test_the_rq_worker_ends_with_relay_jobs_killed_by_kill_9(processes):
    """The rq worker gets SIGTERM when `relay jobs` dies. Whether it deregisters depends
    on whether rq had installed its handlers yet (rq announces itself first): if not, it
    stays announced until rq's TTL, as any worker killed then."""
    jobs = processes.jobs()
    connection = connect(processes.redis_url)
    wait_for(lambda: operations.has_worker(connection), timeout=15, interval=0.1)
    with open(f"/proc/{jobs.pid}/task/{jobs.pid}/children") as f:
        (rq_pid,) = [int(pid) for pid in f.read().split()]
    jobs.kill()
    jobs.wait()
    wait_for(lambda: not os.path.exists(f"/proc/{rq_pid}"), timeout=10, interval=0.1)
    assert not os.path.exists(f"/proc/{rq_pid}")     # not left retrying on its own


# an rq worker that announces itself and never handles signals: rq's own between its
# register_birth and its signal handlers
UNHANDLING_RQ = """#!{python}
import sys, time
import redis
from rq import Queue, Worker
connection = redis.Redis.from_url(sys.argv[3])
Worker([Queue(sys.argv[4], connection=connection)], connection=connection).register_birth()
time.sleep(60)
"""


def test_a_sigterm_before_rq_handles_signals_still_stops_it_cleanly(processes, tmp_path):
    rq = tmp_path / "rq"
    rq.write_text(UNHANDLING_RQ.format(python=sys.executable))
    rq.chmod(0o755)
    jobs = subprocess.Popen([sys.executable, "-c",
                             "import sys; from workers.jobs import run_worker; "
                             f"sys.exit(run_worker({str(rq)!r}, {processes.redis_url!r}))"])
    connection = connect(processes.redis_url)
    try:
        wait_for(lambda: operations.has_worker(connection), timeout=15, interval=0.05)
        jobs.send_signal(signal.SIGTERM)
        assert jobs.wait(10) == 0
    finally:
        jobs.kill()
    assert not operations.has_worker(connection)


def test_a_sigterm_while_the_rq_worker_is_spawned_reaches_it(processes, monkeypatch):
    """The stop comes inside Popen, before run_worker holds the process: it is held
    (stops_held) and forwarded once the worker is in hand, and the jobs exit 0."""
    forwarded: list = []

    class Spawning:
        pid = 1 << 22       # above any pid_max: no rq registration to take back

        def __init__(self, *args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before this returns

        def send_signal(self, signum):
            forwarded.append(signum)

        def wait(self, timeout=None):
            assert forwarded, "the stop never reached the rq worker"
            return -forwarded[0]
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setattr(subprocess, "Popen", Spawning)
    try:
        assert run_worker("rq", processes.redis_url) == 0
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert forwarded == [signal.SIGTERM]
