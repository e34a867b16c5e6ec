"""One broker and scanner for all the cases of a parametrized test on one deployment.

A test marked `reuse_processes` (tests/conftest.py) gets, in its first case, processes
started as for any test (on a flushed Redis); its next cases on the same deployment,
when they follow it in the same xdist worker, get those same processes again: each
broker(), scanner() or jobs() call a fixture makes is answered with what the first
case's same call started. Starting a broker and a scanner costs about a second of CPU;
most cases of protocol and HTTP error tests take a tenth of that.

Only tests whose cases leave nothing that another case's assertions could see are
marked: each sends input the broker refuses (nothing published, or published where no
case looks) and checks the answer. The Redis is not flushed between cases, so a case
that did leave something behind would show it to the next, never hide it.

Before a case gets the processes again, each must still run, the Redis must not have
been flushed since they started (a key of ours is still there), and each broker must
have finished with the previous case's connections (its relay_clients gauge back to
0: their disconnects, requeues included, are done). Otherwise, and after a case
fails, the processes are stopped and the case starts its own. They are stopped too
as soon as any other test starts, so no other test meets a broker it did not start.
"""

import secrets
import urllib.request

from relay.store.connection import connect
from tests.helpers.processes import Processes
from tests.helpers.servers import flush
from tests.helpers.wait import wait_for

MARKER = "relay-tests:reused-processes"


def group_of(item) -> tuple:
    """The cases that share processes: one test function's on one deployment."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    return item.module.__name__, item.originalname, params.get("deployment")


def clients(http_port: int) -> int:
    """A broker's TCP clients, from its /metrics (len(broker.clients))."""
    url = f"http://127.0.0.1:{http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("relay_clients "):
                return int(float(line.split()[1]))
    raise AssertionError(f"no relay_clients in {url}")


class ReusedProcesses(Processes):
    """Processes that record what the first case started and give it again to the
    next cases of its group."""

    def __init__(self, group: tuple, redis_url: str, tmpdir: str):
        super().__init__(redis_url, tmpdir)
        self.group = group
        self.calls: list[tuple] = []        # (what, args, result) in the order asked
        self.replayed: int | None = None    # calls given again in this case; None: first
        self.token = secrets.token_hex(8)
        client = connect(redis_url)
        client.set(MARKER, self.token)
        client.close()

    def next_case(self) -> None:
        self.replayed = 0

    def _call(self, what: str, args: tuple, start):
        if self.replayed is None:
            result = start()
            self.calls.append((what, args, result))
            return result
        if self.replayed >= len(self.calls) or self.calls[self.replayed][:2] != (what, args):
            raise AssertionError(f"{self.group}: a case asked for {what}{args}, where the "
                                 f"first asked for {[c[:2] for c in self.calls]}: its cases "
                                 f"cannot share processes (take off reuse_processes)")
        self.replayed += 1
        return self.calls[self.replayed - 1][2]

    def broker(self, *args, port=None, env=None):
        return self._call("broker", (args, port, env),
                          lambda: Processes.broker(self, *args, port=port, env=env))

    def scanner(self, *args):
        return self._call("scanner", args, lambda: Processes.scanner(self, *args))

    def jobs(self, *args):
        return self._call("jobs", args, lambda: Processes.jobs(self, *args))

    def broker_sharing(self, port, *args):
        raise AssertionError("broker_sharing picks new ports each time: not for "
                             "reuse_processes")

    def usable(self, redis_url: str) -> bool:
        """Whether the next case may have these processes (see the module's doc)."""
        if redis_url != self.redis_url or any(p.poll() is not None for p in self.procs):
            return False
        client = connect(redis_url)
        try:
            if client.get(MARKER) != self.token.encode():
                return False
        finally:
            client.close()
        return all(wait_for(lambda: clients(http) == 0, timeout=5.0)
                   for http in self.http_ports.values())


_current: ReusedProcesses | None = None


def processes_for(item, redis_url: str, tmpdir: str) -> ReusedProcesses:
    """The processes of the case `item`: those of its group's previous case if usable,
    else new ones on the flushed Redis."""
    global _current
    group = group_of(item)
    if _current is not None and _current.group == group and _current.usable(redis_url):
        _current.next_case()
        return _current
    release()
    flush(redis_url)
    _current = ReusedProcesses(group, redis_url, tmpdir)
    return _current


def release(unless_group: tuple | None = None) -> None:
    """Stop the processes kept for a group (but for `unless_group`'s)."""
    global _current
    if _current is not None and _current.group != unless_group:
        _current.stop_all()
        _current = None
