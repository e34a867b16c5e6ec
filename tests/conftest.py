"""Fixtures: Redis (fakeredis, a real server, a cluster, a cluster with replicas), the store
on it, real broker and scanner processes, and a test PKI; the plain helpers they use are
in tests/helpers/."""

import os
import shutil
import tempfile

import fakeredis
import gevent
import pytest

from relay import embedded
from relay.store import Store
from relay.store.connection import connect
from tests.helpers.ports import worker_ports
from tests.helpers import reuse
from tests.helpers.processes import Processes
from tests.helpers.servers import flush, local_cluster, replicated_cluster
from tests.helpers.tls import write_pki

ports = worker_ports()
embedded.free_port, embedded.free_ports = ports.free_port, ports.free_ports


# Modules whose tests run against a one-node Redis and again against a 3-master
# Redis Cluster (the `deployment` parameter): the integration suite.
CLUSTER_MODULES = {"test_nsq_clients", "test_client", "test_protocol", "test_http",
                   "test_admin_processes", "test_deadletter", "test_shutdown", "test_auth",
                   "test_nsqadmin"}


def pytest_generate_tests(metafunc):
    """Tests of CLUSTER_MODULES, and tests marked `cluster`, run on both deployments
    (unless they parametrize `deployment` themselves)."""
    explicit = any("deployment" in str(m.args[0])
                   for m in metafunc.definition.iter_markers("parametrize"))
    if "deployment" in metafunc.fixturenames and not explicit:
        module = metafunc.module.__name__.rpartition(".")[2]
        both = module in CLUSTER_MODULES or metafunc.definition.get_closest_marker("cluster")
        metafunc.parametrize("deployment", ["redis", "cluster"] if both else ["redis"])


@pytest.fixture(autouse=True)
def hub_time():
    """The hub's clock read anew before each test. libev starts a timer from the time its
    loop last ran, which in a test process can be many tests ago: a `joinall(timeout=10)`
    then ran out at once, 12 s stale, with its greenlets half done (test_commit under
    load)."""
    gevent.get_hub().loop.update_now()


@pytest.fixture
def redis_url(deployment, request):
    """The Redis of this test: one server, or the cluster."""
    return request.getfixturevalue("cluster_url" if deployment == "cluster"
                                   else "single_redis_url")


@pytest.fixture(scope="session")
def cluster_url():
    """A local Redis Cluster of 3 masters from the embedded Valkey server;
    RELAY_TEST_CLUSTER_URL instead if given."""
    if os.environ.get("RELAY_TEST_CLUSTER_URL"):
        yield os.environ["RELAY_TEST_CLUSTER_URL"]
        return
    with local_cluster([embedded.free_port() for _ in range(3)]) as url:
        yield url


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


@pytest.fixture(scope="module")
def replicated():
    """A cluster of 3 masters with a replica each, for the tests of one module:
    (url, {port: process}, data dir)."""
    with replicated_cluster() as cluster:
        yield cluster


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


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "reuse_processes: the cases of this parametrized test on one deployment "
        "share one set of processes, started by the first (tests/helpers/reuse.py)")


def _reused_group(item):
    if item is None or item.get_closest_marker("reuse_processes") is None:
        return None
    return reuse.group_of(item)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    """Processes kept for the cases of a reuse_processes test stop once the next test
    is none of them (before the session's Redis stops, when it is the last)."""
    reuse.release(unless_group=_reused_group(nextitem))


def pytest_runtest_setup(item):
    reuse.release(unless_group=_reused_group(item))


@pytest.fixture
def processes(redis_url, tmp_path, request):
    reused = request.node.get_closest_marker("reuse_processes") is not None
    if reused:
        procs = reuse.processes_for(request.node, redis_url, str(tmp_path))
    else:
        flush(redis_url)
        procs = Processes(redis_url, str(tmp_path))
    yield procs
    failed = request.node.rep_call.failed if hasattr(request.node, "rep_call") else False
    if reused and not failed and hasattr(request.node, "rep_call"):
        return      # kept for the next case: reuse.release stops them
    if reused:
        reuse.release()
    else:
        procs.stop_all()
    if failed:
        print(procs.logs())


@pytest.fixture
def broker(processes):
    """One broker and one scanner; the broker's TCP port."""
    _, port = processes.broker()
    processes.scanner()
    return port


@pytest.fixture
def own_redis(tmp_path):
    """A Redis of the test's own (conf/redis.conf), to stop, kill and start again:
    (port, {"proc": its process}, restart)."""
    port = embedded.free_port()
    conf = os.path.join(os.path.dirname(os.path.dirname(__file__)), "conf", "redis.conf")
    data = str(tmp_path / "redis")
    server = {"proc": embedded.start(port, data, conf)}

    def restart():
        server["proc"] = embedded.start(port, data, conf)
    yield port, server, restart
    server["proc"].kill()
    server["proc"].wait()


@pytest.fixture
def dead_redis_broker(processes, own_redis):
    """A broker whose Redis went away after it started (killed): it listens only once
    its Redis serves, so it is started before."""
    redis_port, server, _ = own_redis
    _, port = processes.broker("--redis-url", f"redis://127.0.0.1:{redis_port}/0",
                               "--redis-timeout", "500ms")
    server["proc"].kill()
    server["proc"].wait()
    return port


# -- TLS -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, the broker's certificate for 127.0.0.1 and its key, a client certificate,
    another key, all in one folder: their paths (tests/helpers/tls.py)."""
    return write_pki(tmp_path_factory.mktemp("pki"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)
