"""A broker, scanner, jobs worker or console on a Redis whose data layout it cannot read
(relay/store/layout.py): it refuses to start in one line, or, when it finds one mid-run,
stops without touching data."""

import os
import socket

import pytest

from relay import embedded
from relay.store import Store, keys
from relay.store.connection import connect
from relay.store.layout import Deployment
from tests.helpers.servers import flush
from tests.helpers.wait import wait_for
from tests.helpers.wire import Wire

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

REFUSAL = ("relay 0.6.2 reads data layout 2, 3, 4, 5; this Redis holds data layout 6: run a "
           "release that reads layout 6 (`relay-admin upgrade status` lists the live ones)")


def log_of(processes, command: str) -> str:
    """The log of the test's one `command` process."""
    [name] = [n for n in os.listdir(processes.tmpdir) if n.startswith(f"{command}-")]
    with open(os.path.join(processes.tmpdir, name)) as f:
        return f.read()


def arguments(command: str) -> list[str]:
    port = lambda: f"127.0.0.1:{embedded.free_port()}"  # noqa: E731
    return {"broker": ["--tcp-address", port(), "--http-address", port(),
                       "--lookupd-http-address", ""],
            "console": ["--console-address", port()]}.get(command, [])


@pytest.fixture
def client(redis_url):
    """A client of the test's Redis, flushed after the test (and after its processes
    stopped, as it is asked for first): the layout no release reads that the test sets
    would refuse the processes of a later test on the same Redis that does not flush it
    first (test_processes_cli's failed so when run after this module)."""
    yield connect(redis_url)
    flush(redis_url)


@pytest.mark.parametrize("command", ["broker", "scanner", "jobs", "console"])
def test_a_process_refuses_to_start_on_a_layout_it_cannot_read(client, processes, command):
    client.set(keys.LAYOUT, 6)
    proc = processes._start(command, arguments(command))
    assert proc.wait(30) == 2
    assert log_of(processes, command).splitlines() == [f"relay: {REFUSAL}"]
    assert client.get(keys.LAYOUT) == b"6"
    assert Deployment.read(client).processes == []


def test_processes_that_find_a_layout_they_cannot_read_stop_without_touching_data(
        client, processes):
    """The broker stops without its drain (which would requeue the message it holds in
    flight) and without leaving the registry; the scanner and jobs worker stop too."""
    broker, port = processes.broker()
    running = {"broker": broker, "scanner": processes.scanner(), "jobs": processes.jobs()}
    releases = lambda: sorted((p.kind, p.release) for p in Deployment.read(client).processes)  # noqa: E731,E501
    assert wait_for(lambda: releases() == [("broker", "0.6.2"), ("jobs", "0.6.2"),
                                           ("scanner", "0.6.2")], timeout=15)
    consumer = Wire(port)
    consumer.identify()
    consumer.sub("t", "c", rdy=1)
    assert Wire(port).pub("t", b"held") == (0, b"OK")
    assert consumer.message()[3] == b"held"
    [broker_id] = [p.id for p in Deployment.read(client).processes if p.kind == "broker"]

    client.set(keys.LAYOUT, 6)
    for command, proc in running.items():
        assert proc.wait(15) == 2, command
        assert 'level=critical logger=relay.' in log_of(processes, command), command
        assert REFUSAL in log_of(processes, command)
        assert "Traceback" not in log_of(processes, command)
    channel = Store(client).reads.read_channel("t", "c")
    assert (channel["in_flight_count"], channel["depth"]) == (1, 0)
    assert client.zscore(keys.BROKERS, broker_id) is not None
    assert broker_id.startswith(socket.gethostname())
    consumer.close()
