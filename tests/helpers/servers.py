"""Redis for tests: a local cluster, and emptying or listing keys on one server or on
every master of a cluster."""

import contextlib
import shutil
import tempfile

from relay import embedded
from relay.store.connection import connect, is_cluster
from relay.store.keys import TopicKeys


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


def wake_listeners(url: str, topic: str) -> int:
    """How many brokers listen to a topic's wake-ups: sharded subscribers on a cluster
    node (Redis 7+, Valkey), classic ones on one server."""
    client = connect(url)
    channel = TopicKeys.of(topic).wake
    if is_cluster(client):
        node = client.get_node_from_key(channel).redis_connection
        return int(node.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1])
    return client.pubsub_numsub(channel)[0][1]


@contextlib.contextmanager
def local_cluster(ports: list):
    """A cluster of one master per port, without persistence, removed at the end."""
    data = tempfile.mkdtemp(prefix="relay-test-cluster-")
    procs = embedded.start_cluster(ports, data, extra=("--save", "", "--appendonly", "no"))
    try:
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)
        shutil.rmtree(data, ignore_errors=True)


@contextlib.contextmanager
def replicated_cluster():
    """A cluster of 3 masters with a replica each, without persistence:
    (url, {port: process}, data dir). A process the test killed is left as it is."""
    first = embedded.free_ports(6)
    ports = list(range(first, first + 6))
    data = tempfile.mkdtemp(prefix="relay-test-replicas-")
    procs = dict(zip(ports, embedded.start_cluster(ports, data,
                                                   extra=("--save", "", "--appendonly", "no"),
                                                   replicas=1)))
    try:
        yield f"redis://127.0.0.1:{first}/0", procs, data
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            proc.wait(10)
        shutil.rmtree(data, ignore_errors=True)
