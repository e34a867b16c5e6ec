"""Starting before Redis is there and stopping while it is gone, as a Procfile does:
`relay broker`, `relay scanner` and `relay jobs` as real processes, each waiting with one
line for a Redis (or a cluster covering every slot) that comes later, then serving; and
each stopped (SIGTERM) while waiting, or with its Redis gone, within its drain time, in
one line and no traceback."""

import calendar
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import pytest
import redis
import rq

from relay import embedded
from relay.broker.broker import DRAIN_GRACE, SHUTDOWN_GRACE
from relay.broker.wakeups import CATCH_UP as WAKEUPS_CATCH_UP
from relay.store.connection import READY_EVERY, connect, connect_when_ready
from workers import operations
from workers.jobs import worker_connection
from tests.helpers.wait import wait_for, wait_until
from tests.helpers.wire import FRAME_RESPONSE, Wire

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

LINE = re.compile(r'ts=\S+ level=(\w+) logger=(\S+) msg="(.*)"')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELAY_FRAME = re.compile(rf'File "{re.escape(ROOT)}/(relay|workers)/')  # relay's own code


class Relay:
    """One `python -m relay COMMAND` with its stderr in a file, read as log lines."""

    def __init__(self, folder, command: str, url: str, *args: str):
        self.command, self.url = command, url
        self.err_path = os.path.join(folder, f"{command}.err")
        if command == "broker":
            self.port = embedded.free_port()
            args = ("--tcp-address", f"127.0.0.1:{self.port}", "--http-address", "", *args)
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "relay", command,
                                          "--redis-url", url, *args], cwd=folder,
                                         stdout=subprocess.DEVNULL, stderr=err)

    def stderr(self) -> str:
        with open(self.err_path) as f:
            return f.read()

    def lines(self) -> list:
        """relay's log lines as (level, message), every one from this process's logger;
        for `relay jobs`, the rq worker's own output (its lines, and a traceback its
        pubsub thread may print when Redis is gone) left out."""
        out = []
        for line in self.stderr().splitlines():
            if self.command == "jobs" and not LINE.fullmatch(line):
                continue
            match = LINE.fullmatch(line)
            assert match and match.group(2).startswith("relay."), self.stderr()
            level, _, message = match.groups()
            out.append((level, message))
        return out

    def traceback_free(self) -> bool:
        """No traceback (for `relay jobs`: none through relay's code; rq's are rq's)."""
        if self.command == "jobs":
            return not RELAY_FRAME.search(self.stderr())
        return "Traceback" not in self.stderr()

    def wait_line(self, text: str, timeout: float = 15.0) -> None:
        wait_for(lambda: text in self.stderr() or self.proc.poll() is not None, timeout)
        assert text in self.stderr(), self.stderr()

    def stop(self) -> tuple:
        """SIGTERM: (exit status, seconds until it exited)."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(DRAIN_GRACE + SHUTDOWN_GRACE + 5)
        return code, time.monotonic() - started


@pytest.fixture
def relay_processes(tmp_path):
    """Starts `relay COMMAND` processes (Relay), ended with the test."""
    started: list[Relay] = []

    def start(command, url, *args):
        started.append(Relay(str(tmp_path), command, url, *args))
        return started[-1]
    yield start
    for process in started:
        if process.proc.poll() is None:
            process.proc.kill()
            process.proc.wait()


def all_three(start, url) -> dict:
    return {name: start(name, url) for name in ("broker", "scanner", "jobs")}


def waiting(url: str, reason: str) -> tuple:
    return ("info", f"redis at {url} not ready ({reason}): waiting for it")


def refused(port: int) -> str:
    return f"Error 111 connecting to 127.0.0.1:{port}. Connection refused."


READY = re.compile(r"redis at \S+ ready after \d+\.\d s")


def check_serving(processes: dict, jobs_connection, since: float) -> dict:
    """Each process serves: the broker answers a PUB with OK, the scanner requeues a
    message whose timeout passed, an rq job runs. Seconds from `since` (time.time())
    to the broker's first OK and to the others' line saying Redis is ready."""
    taken = {}
    broker = processes["broker"]
    embedded.wait_for_port("127.0.0.1", broker.port, broker.proc, timeout=15)
    consumer = Wire(broker.port)
    consumer.identify(msg_timeout=1000)
    assert consumer.sub("t", "c", rdy=1) == (FRAME_RESPONSE, b"OK")
    assert Wire(broker.port).pub("t", b"held") == (FRAME_RESPONSE, b"OK")
    taken["broker"] = round(time.time() - since, 2)
    assert consumer.message()[1:4:2] == (1, b"held")       # not FINed: times out
    assert consumer.message()[1:4:2] == (2, b"held")       # requeued by the scanner
    job = rq.Queue(operations.QUEUE, connection=jobs_connection).enqueue(len, "abc")
    wait_for(lambda: job.get_status() == "finished", timeout=20, interval=0.1)
    assert (job.get_status(), job.return_value()) == ("finished", 3)
    for name in ("scanner", "jobs"):
        ready = next(line for line in processes[name].stderr().splitlines()
                     if "ready after" in line)
        taken[name] = round(max(_logged_at(ready) - since, 0.0), 2)  # or as soon
    return taken


def _logged_at(line: str) -> float:
    """The time (epoch seconds) of a log line."""
    stamp = re.match(r"ts=(\S+)Z", line).group(1)
    return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) + float(stamp[19:])


def assert_started_after_waiting(processes: dict, url: str, reason: str) -> None:
    broker_lines = processes["broker"].lines()
    assert broker_lines[0] == waiting(url, reason)
    assert READY.fullmatch(broker_lines[1][1]) and broker_lines[1][0] == "info"
    assert broker_lines[2][1].startswith("broker ") and " listening tcp=" in broker_lines[2][1]
    assert len(broker_lines) == 3, broker_lines
    scanner_lines = processes["scanner"].lines()
    assert scanner_lines[0] == waiting(url, reason)
    assert READY.fullmatch(scanner_lines[1][1])
    assert scanner_lines[2] == ("info", "scanner started interval=100ms limit=1000")
    assert scanner_lines[3][0] == "info" and re.fullmatch(    # once topic t was there
        r"node due indexes seeded from 1 parts \(\d entries\)", scanner_lines[3][1])
    assert len(scanner_lines) == 4, scanner_lines
    jobs_lines = processes["jobs"].lines()
    assert jobs_lines[0] == waiting(url, reason) and READY.fullmatch(jobs_lines[1][1])
    assert len(jobs_lines) == 2, jobs_lines
    for process in processes.values():
        assert process.traceback_free(), process.stderr()


# -- started before Redis --------------------------------------------------------------

def test_a_redis_gone_again_before_the_first_reads_is_waited_for_again(single_redis_url):
    """A scanner whose Redis answered the readiness check, then was killed before the
    scanner read its data layout, died with a traceback (test_outage in CI); each process
    waits for Redis again instead (connect_when_ready)."""
    calls = []

    def establish(client):
        calls.append(client)
        if len(calls) == 1:
            raise redis.exceptions.ConnectionError("Error 111 connecting. Connection refused.")
        return client.ping()

    options = SimpleNamespace(redis_url=single_redis_url, redis_timeout=1000)
    naps = []
    client, layout = connect_when_ready(options, lambda: False, logging.getLogger("test"),
                                        naps.append, first=establish)
    assert (layout, len(calls), naps) == (True, 2, [READY_EVERY])
    assert calls[1] is client and client.ping()


def test_each_waits_for_a_redis_started_after_it_then_serves(relay_processes, tmp_path):
    port = embedded.free_port()
    url = f"redis://127.0.0.1:{port}/0"
    processes = all_three(relay_processes, url)
    for process in processes.values():
        process.wait_line("waiting for it")
    time.sleep(1.0)                             # waiting says nothing more meanwhile
    for process in processes.values():
        assert process.lines() == [waiting(url, refused(port))]

    server = embedded.start(port, str(tmp_path / "redis"), extra=("--appendonly", "no"))
    try:
        taken = check_serving(processes, redis.Redis(port=port), time.time())
        assert_started_after_waiting(processes, url, refused(port))
    finally:
        server.kill()
        server.wait()
    print(f"one server: serving after Redis was ready: {taken}")


@pytest.fixture
def uncovered_cluster():
    """A 3-master cluster whose first master has given up its slots (0-5460): the state
    of a cluster still forming, as its first node sees it. Yields (url, cover), cover()
    giving the slots back."""
    first = embedded.free_ports(3)
    ports = [first, first + 1, first + 2]
    data = tempfile.mkdtemp(prefix="relay-test-uncovered-")
    procs = embedded.start_cluster(ports, data, extra=("--save", "", "--appendonly", "no"))
    node = redis.Redis(port=first)
    slots = range(0, embedded.SLOTS // 3)   # 0-5460: the first master's
    node.execute_command("CLUSTER DELSLOTS", *slots)
    try:
        yield f"redis://127.0.0.1:{first}/0", \
            lambda: node.execute_command("CLUSTER ADDSLOTS", *slots)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_each_waits_for_a_cluster_to_cover_every_slot_then_serves(relay_processes,
                                                                   uncovered_cluster):
    url, cover = uncovered_cluster
    processes = all_three(relay_processes, url)
    reason = "cluster_state is fail, 10923 of 16384 slots covered"
    for process in processes.values():
        process.wait_line("waiting for it")
    time.sleep(1.0)
    for process in processes.values():
        assert process.lines() == [waiting(url, reason)]

    cover()
    taken = check_serving(processes, worker_connection(connect(url)), time.time())
    assert_started_after_waiting(processes, url, reason)
    print(f"cluster: serving after its slots were covered: {taken}")


def test_a_broker_started_before_relay_redis_cluster_serves_once_it_formed(relay_processes,
                                                                           tmp_path):
    first = embedded.free_ports(3)
    url = f"redis://127.0.0.1:{first}/0"
    broker = relay_processes("broker", url)
    broker.wait_line("waiting for it")
    cluster = subprocess.Popen([sys.executable, "-m", "relay", "redis", "--cluster", "3",
                                "--redis-url", url, "--data-dir", str(tmp_path / "cluster")],
                               cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        embedded.wait_for_port("127.0.0.1", broker.port, broker.proc, timeout=30)
        assert Wire(broker.port).pub("t", b"x") == (FRAME_RESPONSE, b"OK")
        lines = broker.lines()
        assert lines[0] == waiting(url, refused(first))
        assert READY.fullmatch(lines[1][1]) and " listening tcp=" in lines[2][1]
        assert len(lines) == 3 and "Traceback" not in broker.stderr(), lines
    finally:
        cluster.terminate()
        cluster.wait(15)


# -- stopped while Redis is not there -------------------------------------------------

STOPPED_WAITING = {
    "broker": "broker stopped before redis at {url} was ready: it served nothing and "
              "registered nowhere",
    "scanner": "scanner stopped before redis at {url} was ready: it scanned nothing and "
               "registered nowhere",
    "jobs": "jobs stopped while waiting for redis at {url}: no rq worker was running",
}


def test_each_stops_at_once_while_waiting_for_redis(relay_processes):
    port = embedded.free_port()
    url = f"redis://127.0.0.1:{port}/0"
    processes = all_three(relay_processes, url)
    for process in processes.values():
        process.wait_line("waiting for it")
    for name, process in processes.items():
        code, took = process.stop()
        assert (code, process.lines()) == (0, [
            waiting(url, refused(port)), ("info", STOPPED_WAITING[name].format(url=url))])
        assert took < 2.0
        print(f"{name}: exited {took:.2f} s after SIGTERM while waiting")


def own_redis(kind: str, folder: str):
    """(url, the server processes, an error a client meets once they are gone)."""
    if kind == "single":
        port = embedded.free_port()
        proc = embedded.start(port, folder, extra=("--appendonly", "no", "--save", ""))
        return f"redis://127.0.0.1:{port}/0", [proc], re.escape(refused(port))
    first = embedded.free_ports(3)
    procs = embedded.start_cluster([first, first + 1, first + 2], folder,
                                   extra=("--save", "", "--appendonly", "no"))
    return f"redis://127.0.0.1:{first}/0", procs, (
        r"Redis Cluster cannot be connected\. Please provide at least one reachable node: "
        rf"Error 111 connecting to 127\.0\.0\.1:({first}|{first + 1}|{first + 2})\. "
        r"Connection refused\.")


@pytest.mark.parametrize("redis_kind", ["single", "cluster"])
def test_each_stops_within_its_drain_time_with_redis_gone(relay_processes, tmp_path,
                                                          redis_kind):
    url, servers, error = own_redis(redis_kind, str(tmp_path / "redis"))
    try:
        processes = all_three(relay_processes, url)
        broker, scanner, jobs = processes.values()
        embedded.wait_for_port("127.0.0.1", broker.port, broker.proc, timeout=15)
        consumer = Wire(broker.port)
        consumer.identify()
        assert consumer.sub("t", "c", rdy=1) == (FRAME_RESPONSE, b"OK")
        assert Wire(broker.port).pub("t", b"held") == (FRAME_RESPONSE, b"OK")
        assert consumer.message()[3] == b"held"          # held in flight at the stop
        scanner.wait_line("scanner started")
        client = connect(url)
        wait_for(lambda: operations.has_worker(worker_connection(client)), 15, 0.1)
    finally:
        for server in servers:
            server.kill()
            server.wait()
    scanner.wait_line("not ready")          # the scanner's next pass found it gone

    for process in processes.values():
        process.proc.send_signal(signal.SIGTERM)
    stopped, took = time.monotonic(), {}
    for name in ("scanner", "jobs", "broker"):    # the broker drains its consumer last
        assert processes[name].proc.wait(DRAIN_GRACE + SHUTDOWN_GRACE + 5) == 0
        took[name] = round(time.monotonic() - stopped, 2)
    assert took["scanner"] < 2 and took["jobs"] < 2
    assert DRAIN_GRACE - 0.5 < took["broker"] < DRAIN_GRACE + SHUTDOWN_GRACE + 1
    print(f"{redis_kind}: exited after SIGTERM with Redis gone: {took}")

    lines = broker.lines()
    stopping = next(i for i, (_, text) in enumerate(lines) if " stopping (tcp=" in text)
    broker_id = re.match(r"broker (\S+) stopping", lines[stopping][1]).group(1)
    assert len(lines) == stopping + 2, lines
    assert lines[stopping + 1][0] == "warning"
    assert re.fullmatch(
        rf"redis unreachable while stopping \({error}\): the registration of broker "
        rf"{broker_id} expires by itself within 15 s, then a scanner reaps what it left, "
        r"requeueing the 1 message its clients held in flight", lines[stopping + 1][1])

    lines = [line for line in scanner.lines()   # seeding may come before the stop or not
             if not line[1].startswith("node due indexes seeded")]
    # a new connection is refused; one the pool kept from before the kill is reset (or
    # found closed) at its first use, which the stop's deregistering may be
    stopped_pass = (rf"({error}|Error 111 connecting to 127\.0\.0\.1:\d+\. Connection refused\."
                    r"|Error while reading from 127\.0\.0\.1:\d+ : \(104, 'Connection reset "
                    r"by peer'\)|Connection closed by server\.)")
    assert lines[0] == ("info", "scanner started interval=100ms limit=1000")
    assert lines[1][0] == "info" and re.fullmatch(
        rf"redis at {re.escape(url)} not ready \({stopped_pass}\): waiting for it", lines[1][1])
    assert lines[2][0] == "warning" and re.fullmatch(
        rf"redis unreachable while stopping \({stopped_pass}\): the registration "
        r"of scanner \S+ expires by itself within 5 s, then the other scanners take "
        r"over its share", lines[2][1])
    assert lines[3:] == [("info", "scanner stopped timed_out=0 promoted=0 dead=0 reaped=0")]

    lines = jobs.lines()
    if lines[0] == ("warning", "rq worker exited with 1; starting another once Redis answers"):
        # the rq worker may die of the outage before the stop comes (rq exits on some
        # Redis errors): the stop then ends relay jobs' wait for Redis
        assert lines[1:] == [("info", f"jobs stopped while waiting for redis at {url}: no rq "
                                      "worker was running")], lines
    else:
        assert len(lines) == 1 and lines[0][0] == "warning", lines
        assert re.fullmatch(r"redis unreachable while stopping \(Error 111 connecting to "
                            r"127\.0\.0\.1:\d+\. Connection refused\.\): rq worker \d+ could "
                            r"not deregister; rq forgets it when its heartbeat expires "
                            r"\(rq's worker TTL\)", lines[0][1])
    for process in processes.values():
        assert process.traceback_free(), process.stderr()


@pytest.mark.parametrize("redis_kind", ["single", "cluster"])
def test_a_broker_left_without_redis_says_so_once(relay_processes, tmp_path,
                                                 redis_kind):
    """Redis gone for a few of the broker's once-a-second version reads: a warning
    line the first time, no traceback (a cluster none of whose nodes answers raises
    redis-py's RedisClusterException, not a ConnectionError)."""
    url, servers, error = own_redis(redis_kind, str(tmp_path / "redis"))
    try:
        broker = relay_processes("broker", url)
        embedded.wait_for_port("127.0.0.1", broker.port, broker.proc, timeout=15)
        consumer = Wire(broker.port)
        consumer.identify()
        assert consumer.sub("t", "c", rdy=1) == (FRAME_RESPONSE, b"OK")
    finally:
        for server in servers:
            server.kill()
            server.wait()
    time.sleep(WAKEUPS_CATCH_UP * 3.5)
    assert broker.proc.poll() is None
    versions = [(level, text) for level, text in broker.lines()
                if "topics' versions" in text]
    assert len(versions) == 1, versions
    assert versions[0][0] == "warning" and re.fullmatch(
        rf"could not read the topics' versions: {error}", versions[0][1]), versions
    assert "Traceback" not in broker.stderr()
