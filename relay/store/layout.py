"""Data layouts: the shape of relay's keys and records, the one in force in a Redis, and
which layouts each live process reads, so two releases run side by side in a rolling
upgrade (README: Upgrading; docs/processes.md).

    1  before issue 35 (2026-11-25): a leases hash beside each in-flight set, records
       in the wire layout, news in each topic's version key. No release since reads it.
    2  since issue 35: what relay 0.1.0 and 0.2.0 read and write.
    3  since issue 59: on a channel made ordered the messages behind an order key wait
       numbered in its msgs hash (scripts/lib/order.lua), not in one sorted set for
       all, which one ordered under layout 2 keeps until it is turned off (relay 0.3.0
       reads both).
    4  since issue 59 item 2: what one deliver call hands one client of an unordered
       channel goes in flight as a lot, one member and one record field for all its
       messages (scripts/lib/inflight.lua; relay 0.5.0).
    5  since issue 60 part 2: a message id's first digit is its priority (0-9), and a
       channel's messages of priority 1-9 wait ready in a list per priority beside its
       queue, counted in its urgent hash (scripts/lib/queue.lua; relay 0.6.0). An
       earlier release would take the digit for part of the part's number and not
       deliver from those lists.

`relay:layout` holds the layout in force, the one every process writes. A broker,
scanner, jobs worker or console reads it once Redis answers (`establish`) and refuses to
start, in one line, when it cannot read it; it reads it again with each heartbeat
(`Presence`) and stops without touching data when it changed to one it cannot read. A
Redis without the key gets the newest layout this release writes that every live
process reads, unless it still holds data of layout 1 (relay/store/layout_one.py).

Each broker, scanner and jobs worker of 0.2.0 on registers in `relay:processes` with
its release and the layouts it reads and writes. One of an earlier release is known by
its broker, scanner or rq registration alone, and reads layout 2 only (EARLIER_READS).
A newer layout is put in force by `relay-admin upgrade finish`, never by itself, and
only when every live process reads it (`Deployment.blockers`).
"""

import dataclasses
import logging
import os
import socket
from typing import Any

import relay
from relay.errors import ConfigError
from relay.liveness import Liveness
from relay.store import bookkeeping, keys, runner
from relay.store.connection import RedisClient, is_cluster
from relay.store.layout_one import find_layout_one

log = logging.getLogger("relay.layout")

RELEASE = relay.__version__
READS = (2, 3, 4, 5)
WRITES = (2, 3, 4, 5)
ORDER_SEQS = 3      # the first layout whose ordered channels number what waits
LOTS = 4            # the first layout with deliveries in flight by lot (lib/inflight.lua)
PRIORITIES = 5      # the first layout with message priorities (lib/queue.lua)
EARLIER = "0.1.0 or earlier"    # a process registered only as a broker, scanner or rq worker
EARLIER_READS = (2,)
LAYOUTS = {1: "before issue 35 (2026-11-25), with a leases hash beside each in-flight set",
           2: "of relay 0.1.0 and 0.2.0",
           3: "of relay 0.3.0, with an ordered channel's waiting messages numbered by key",
           4: "of relay 0.5.0, with deliveries in flight by lot",
           5: "of relay 0.6.0, with message priorities"}
TTL_MS = 15_000         # a process's registration, renewed with its heartbeat


class LayoutRefused(ConfigError):
    """This release cannot read the layout in force: the process must not serve."""


def refusal(in_force: int, found: str | None = None) -> LayoutRefused:
    """The one line a process says when it cannot read layout `in_force`."""
    reads = ", ".join(map(str, READS))
    what = f"this Redis holds data layout {in_force}"
    if in_force in LAYOUTS:
        what += f" ({LAYOUTS[in_force]})"
    if found:
        what += f": {found}"
    if in_force < min(READS):
        todo = (f"serve it with relay 0.1.0 until none of layout {in_force} is left "
                f"(that release reads both), then start {RELEASE}")
    else:
        todo = (f"run a release that reads layout {in_force} "
                "(`relay-admin upgrade status` lists the live ones)")
    return LayoutRefused(f"relay {RELEASE} reads data layout {reads}; {what}: {todo}")


def in_force(client: RedisClient) -> int | None:
    """The layout in force, None in a Redis that has not said (fresh, or of 0.1.0)."""
    value = client.get(keys.LAYOUT)
    return None if value is None else int(value)


def writing(client: RedisClient) -> int:
    """The layout to write now: the one in force, else (a Redis that has not said) the
    newest that every live process reads."""
    layout = in_force(client)
    return Deployment.read(client).newest_readable() if layout is None else layout


def check(client: RedisClient) -> None:
    """Raise LayoutRefused if the layout in force is one this release cannot read (for
    relay-admin: a Redis that has not said is left as it is)."""
    layout = in_force(client)
    if layout is not None and layout not in READS:
        raise refusal(layout)


def establish(client: RedisClient) -> int:
    """The layout in force, set first in a Redis without one; raises LayoutRefused when
    this release cannot read it, and ServerTooOld on a server without functions (the
    library is loaded first: a process starting checks both)."""
    runner.install(client, runner.load_library(sharded=is_cluster(client)))
    layout = in_force(client)
    if layout is None:
        found = find_layout_one(client)
        if found is not None:
            raise refusal(1, found)
        layout = Deployment.read(client).newest_readable()
        client.set(keys.LAYOUT, layout, nx=True)
        layout = in_force(client) or layout
    if layout not in READS:
        raise refusal(layout)
    return layout


@dataclasses.dataclass(frozen=True)
class Process:
    """A live broker, scanner or jobs worker, with the layouts it reads and writes."""
    kind: str
    id: str
    release: str
    reads: tuple[int, ...]
    writes: int | None
    host: str = ""
    library: str = ""   # its function libraries' names (0.6.2 on; "": it does not say)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class Presence:
    """This process in `relay:processes`: registered with each heartbeat, which also reads
    the layout in force again."""

    def __init__(self, client: RedisClient, kind: str, process_id: str, layout: int):
        self.redis = client
        self.kind = kind
        self.id = process_id
        self.layout = layout
        self.processes = Liveness(client, keys.PROCESSES, TTL_MS)
        self.library = " ".join(own_libraries(client))

    def writes(self) -> list[tuple]:
        """The bookkeeping writes of one heartbeat, then the read of the layout in force
        (for a caller that sends them with its own: `refused` reads the last reply)."""
        key = keys.process_key(self.id)
        return [("HSET", key, "kind", self.kind, "release", RELEASE,
                 "reads", ",".join(map(str, READS)), "writes", self.layout,
                 "host", socket.gethostname(), "pid", os.getpid(), "library", self.library),
                ("PEXPIRE", key, TTL_MS), self.processes.heartbeat_write(self.id),
                ("GET", keys.LAYOUT)]

    def refused(self, layout_reply) -> LayoutRefused | None:
        """The refusal to serve on, if the layout in force (the last reply of `writes`)
        is one this release cannot read."""
        if layout_reply is None:
            return None
        layout = int(layout_reply)
        if layout not in READS:
            return refusal(layout)
        self.layout = layout
        return None

    def heartbeat(self) -> LayoutRefused | None:
        """Register now; the refusal to serve on, if any."""
        return self.refused(bookkeeping.write(self.redis, *self.writes())[-1])

    def leave(self, pipe=None) -> None:
        """Deregister now (in the caller's pipeline, if given)."""
        own = pipe is None
        pipe = self.redis.pipeline(transaction=False) if own else pipe
        self.processes.leave(self.id, pipe)
        pipe.delete(keys.process_key(self.id))
        if own:
            pipe.execute()


def stop_now(refused: LayoutRefused) -> None:
    """Stop this process without touching data: what it holds in flight times out and a
    scanner that reads the layout in force requeues it."""
    log.critical("%s; stopping without touching data", refused)
    logging.shutdown()
    os._exit(2)


@dataclasses.dataclass
class Deployment:
    """Every live process on one Redis, and the layout in force."""
    layout: int | None
    processes: list[Process]

    @classmethod
    def read(cls, client: RedisClient) -> "Deployment":
        registered = _registered(client)
        earlier = [("broker", i) for i in Liveness(client, keys.BROKERS, 0).live()] \
            + [("scanner", i) for i in Liveness(client, keys.SCANNERS, 0).live()] \
            + [("jobs", name) for name in _jobs_workers(client)]
        processes = list(registered.values()) + [
            Process(kind, pid, EARLIER, EARLIER_READS, None)
            for kind, pid in earlier if pid not in registered]
        return cls(in_force(client), sorted(processes, key=lambda p: (p.kind, p.id)))

    def newest_readable(self) -> int:
        """The newest layout this release writes that every live process reads."""
        readable = [w for w in WRITES if all(w in p.reads for p in self.processes)]
        return max(readable) if readable else min(WRITES)

    def blockers(self, layout: int) -> list[Process]:
        """The live processes that do not read `layout`."""
        return [p for p in self.processes if layout not in p.reads]

    def next_layout(self) -> int | None:
        """The newest layout this release writes, if newer than the one in force."""
        newest = max(WRITES)
        return newest if self.layout is None or newest > self.layout else None


def _jobs_workers(client: Any) -> list[str]:
    """The names of the `relay jobs` workers alive on the queue."""
    from rq import Queue, Worker    # rq, only once read
    return [w.name for w in Worker.all(connection=client,
                                       queue=Queue(keys.JOBS_QUEUE, connection=client))]


def _registered(client: RedisClient) -> dict[str, Process]:
    """The processes of 0.2.0 on, by id."""
    ids = Liveness(client, keys.PROCESSES, TTL_MS).live()
    pipe = client.pipeline(transaction=False)
    for process_id in ids:
        pipe.hgetall(keys.process_key(process_id))
    out = {}
    for process_id, fields in zip(ids, pipe.execute()):
        if fields:
            f = {k.decode(): v.decode() for k, v in fields.items()}
            out[process_id] = Process(f["kind"], process_id, f["release"],
                                      tuple(int(r) for r in f["reads"].split(",")),
                                      int(f["writes"]), f["host"], f.get("library", ""))
    return out


def finish(client: RedisClient) -> tuple[int, list[Process]]:
    """Put in force the newest layout this release writes, if every live process reads
    it: (the layout in force after, the processes that block it)."""
    deployment = Deployment.read(client)
    target = deployment.next_layout()
    if target is None:
        return deployment.layout or establish(client), []
    blockers = deployment.blockers(target)
    if blockers:
        return deployment.layout or establish(client), blockers
    client.set(keys.LAYOUT, target)
    return target, []


def own_libraries(client: RedisClient) -> list[str]:
    """The function libraries this release's processes load on `client`: on a cluster the
    scripts' (waking by SPUBLISH) and the bookkeeping's (relay/store/bookkeeping.py)."""
    return sorted({runner.load_library().name,
                   runner.load_library(sharded=is_cluster(client)).name})


def prune_libraries(client: RedisClient) -> tuple[list[str], list[Process]]:
    """Delete relay's function libraries that no live process uses (each release loads
    its own, about 0.5 MB of Redis), once every live process says which it uses (0.6.2
    on): (the names deleted, the live processes that do not say). This process's own
    stays; one not registered that used a deleted one (a Spark job, say) loads it again
    at its next call (runner.ScriptRunner._again)."""
    processes = Deployment.read(client).processes
    silent = [p for p in processes if not p.library]
    if silent:
        return [], silent
    kept = {name for p in processes for name in p.library.split()} | set(own_libraries(client))
    deleted: set[str] = set()
    for server in runner.masters(client):
        for name in runner.libraries(server):
            if name not in kept:
                server.function_delete(name)
                deleted.add(name)
    return sorted(deleted), []
