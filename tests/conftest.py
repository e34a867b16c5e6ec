"""Fixtures: the store on both backends (fakeredis and the embedded real server)."""

import contextlib
import os
import subprocess
import sys
import shutil
import tempfile

import fakeredis
import pytest

from relay import embedded
from relay.store import Store
from relay.store.connection import connect, is_cluster


# Modules whose tests run against a one-node Redis and again against a 3-master
# Redis Cluster (the `deployment` parameter): the integration suite.
CLUSTER_MODULES = {"test_clients", "test_protocol", "test_http", "test_admin_processes",
                   "test_deadletter", "test_shutdown", "test_auth", "test_nsqadmin"}


def pytest_generate_tests(metafunc):
    """Tests of CLUSTER_MODULES, and tests marked `cluster`, run on both deployments."""
    if "deployment" in metafunc.fixturenames:
        module = metafunc.module.__name__.rpartition(".")[2]
        both = module in CLUSTER_MODULES or metafunc.definition.get_closest_marker("cluster")
        metafunc.parametrize("deployment", ["redis", "cluster"] if both else ["redis"])


@pytest.fixture
def redis_url(deployment, request):
    """The Redis of this test: one server, or the cluster."""
    return request.getfixturevalue("cluster_url" if deployment == "cluster"
                                   else "single_redis_url")


def flush(url: str) -> None:
    """Empty every database of a server, or every master of a cluster."""
    client = connect(url)
    if is_cluster(client):
        client.flushall(target_nodes=client.PRIMARIES)
    else:
        client.flushdb()
    client.close()


def all_keys(client, pattern: str) -> list:
    """KEYS on every master of a cluster, or on the one server."""
    if is_cluster(client):
        return client.keys(pattern, target_nodes=client.PRIMARIES)
    return client.keys(pattern)


@pytest.fixture(scope="session")
def cluster_url():
    """A local Redis Cluster of 3 masters from the embedded Valkey server;
    RELAY_TEST_CLUSTER_URL instead if given."""
    if os.environ.get("RELAY_TEST_CLUSTER_URL"):
        yield os.environ["RELAY_TEST_CLUSTER_URL"]
        return
    with local_cluster([embedded.free_port() for _ in range(3)]) as url:
        yield url


@contextlib.contextmanager
def local_cluster(ports: list, binary: str | None = None):
    """A cluster of one master per port, without persistence, removed at the end."""
    data = tempfile.mkdtemp(prefix="relay-test-cluster-")
    procs = embedded.start_cluster(ports, data, extra=("--save", "", "--appendonly", "no"),
                                   binary=binary)
    try:
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
def single_redis_url():
    """A real Redis: RELAY_TEST_REDIS_URL if given, else the embedded server on a free port."""
    if os.environ.get("RELAY_TEST_REDIS_URL"):
        yield os.environ["RELAY_TEST_REDIS_URL"]
        return
    port = embedded.free_port()
    data = tempfile.mkdtemp(prefix="relay-test-redis-")
    proc = embedded.start(port, data, extra=("--save", "", "--appendonly", "no"))
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(params=["fakeredis", "redis", "cluster"])
def backend(request):
    """A flushed Redis client; every test using it runs on fakeredis, a real server and
    a real cluster."""
    if request.param == "fakeredis":
        client = fakeredis.FakeRedis()
        client.flushdb()
        yield client
        client.flushdb()
        return
    url = request.getfixturevalue("cluster_url" if request.param == "cluster"
                                  else "single_redis_url")
    flush(url)
    yield connect(url)
    flush(url)


@pytest.fixture
def store(backend):
    return Store(backend)


# -- real processes ------------------------------------------------------------

class Processes:
    """Broker and scanner processes for one test, on the shared real Redis (flushed)."""

    def __init__(self, redis_url, tmpdir):
        self.redis_url = redis_url
        self.tmpdir = tmpdir
        self.procs = []
        self.http_ports: dict[int, int] = {}
        self.lookupd_ports: dict[int, int] = {}

    def _start(self, command, args, env=None):
        log = open(os.path.join(self.tmpdir, f"{command}-{len(self.procs)}.log"), "w")
        full_env = {**os.environ, "REDIS_URL": self.redis_url, **(env or {})}
        proc = subprocess.Popen([sys.executable, "-m", "relay", command, *args],
                                stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                cwd=self.tmpdir)
        self.procs.append(proc)
        return proc

    def broker(self, *args, port=None, env=None):
        """Start a broker; returns (proc, port) once it accepts connections. Its HTTP
        port is `http_ports[port]`, its lookupd port `lookupd_ports[port]`."""
        port = port or embedded.free_port()
        http_port = self.http_ports.setdefault(port, embedded.free_port())
        lookupd_port = self.lookupd_ports.setdefault(port, embedded.free_port())
        proc = self._start("broker", ["--tcp-address", f"127.0.0.1:{port}",
                                      "--http-address", f"127.0.0.1:{http_port}",
                                      "--lookupd-http-address", f"127.0.0.1:{lookupd_port}",
                                      *args], env)
        embedded.wait_for_port("127.0.0.1", port, proc)
        embedded.wait_for_port("127.0.0.1", http_port, proc)
        embedded.wait_for_port("127.0.0.1", lookupd_port, proc)
        return proc, port

    def scanner(self, *args):
        return self._start("scanner", list(args))

    def jobs(self, *args):
        """`relay jobs`: the rq worker for relay-admin's jobs."""
        return self._start("jobs", list(args))

    def stop_all(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def logs(self):
        out = []
        for name in sorted(os.listdir(self.tmpdir)):
            if name.endswith(".log"):
                with open(os.path.join(self.tmpdir, name)) as f:
                    out.append(f"--- {name}\n{f.read()}")
        return "\n".join(out)


@pytest.fixture
def processes(redis_url, tmp_path, request):
    flush(redis_url)
    procs = Processes(redis_url, str(tmp_path))
    yield procs
    procs.stop_all()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(procs.logs())


@pytest.fixture
def broker(processes):
    """One broker and one scanner; the broker's TCP port."""
    _, port = processes.broker()
    processes.scanner()
    return port


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)
