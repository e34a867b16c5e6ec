"""Long admin operations (empty, delete, requeue --all, redrive, replay) as rq jobs on queue
"relay", which `relay jobs` works through.

An operation is a generator over (store, topic, channel, **params). Its first step makes the
cut in one Redis call and yields the progress, a dict with "done" and "total"; each
further step does one chunk of at most CHUNK entries and yields it again, so every
Redis call stays short and publishing and consuming go on meanwhile. The last
progress is the result. The same generator runs inline for small targets (`run`)
and in the worker for big ones (`perform`, which keeps the progress in job.meta).
A new operation is a generator added to OPERATIONS.
"""

import time
from typing import Any, Callable, Iterator, Sequence

from rq import Queue, Worker, get_current_job
from rq.defaults import RQ_KEY_PREFIX
from rq.exceptions import NoSuchJobError
from rq.job import Job

from relay.codec import record_id
from relay.errors import RelayError
from relay.store import deadletter
from relay.store import Store, codes, guarded, keys
from relay.store.connection import whole
from relay.store.keys import ChannelKeys

QUEUE = keys.JOBS_QUEUE
QUEUE_KEY = f"{RQ_KEY_PREFIX}:queue:{QUEUE}"
CHUNK = 1000
RESULT_TTL = 7 * 24 * 3600
SIZE_COMMANDS = {b"list": "LLEN", b"zset": "ZCARD", b"hash": "HLEN", b"stream": "XLEN",
                 b"none": "EXISTS"}
SAVE_INTERVAL = 0.2


class NotFound(RelayError):
    """The topic or channel is gone."""


def empty(store: Store, topic: str, channel: str):
    """Drop every message the target holds at the start (the cut); the channel's
    ready, in-flight and deferred messages, or the topic's backlog."""
    return _drop(store, topic, channel, delete=False)


def delete(store: Store, topic: str, channel: str):
    """Delete a channel, or a topic with all its channels, and free what they held."""
    return _drop(store, topic, channel, delete=True)


def _drop(store, topic, channel, delete):
    dropped = store.control.detach(topic, channel, delete)
    if dropped is None:
        raise NotFound(f"{target(topic, channel)} not found")
    sizes = trash_sizes(store, dropped.trash)
    progress: dict[str, Any] = {"cut_id": f"{dropped.last_id:016x}", "done": 0,
                                "total": sum(n for _, n in sizes),
                                "messages": sum(n for kind, n in sizes
                                                if kind not in (b"hash", b"stream"))}
    yield progress
    for key in dropped.trash:
        for n in free_trash(store, key, CHUNK):
            progress["done"] += n
            yield progress


def trash_sizes(store: Store, trash: Sequence[str]) -> list[tuple[bytes, int]]:
    """(Redis type, entries) of each trash key, and ("waiting", how many) after a msgs
    hash with messages numbered behind their order keys."""
    pipe = store.redis.pipeline(transaction=False)
    for key in trash:
        pipe.type(key)
    kinds = guarded(pipe.execute)
    for key, kind in zip(trash, kinds):
        pipe.execute_command(SIZE_COMMANDS[kind], key)
        if kind == b"hash":
            pipe.hget(key, keys.WAITING_FIELD)
    replies, sizes = iter(guarded(pipe.execute)), []
    for kind in kinds:
        entries = next(replies)
        waiting = next(replies) if kind == b"hash" else None
        if waiting is None:
            sizes.append((kind, entries))
        else:   # msgs with messages numbered behind their order keys: those are messages
            sizes += [(kind, entries - int(waiting)), (b"waiting", int(waiting))]
    return sizes


def free_trash(store: Store, key: str, count: int) -> Iterator[int]:
    """Free a trash key `count` entries per Redis call, so each call stays short;
    yields how many each call freed."""
    kind = guarded(store.redis.type, key)
    if kind == b"list":
        return _free_list(store.redis, key, count)
    if kind == b"zset":
        return _free_zset(store.redis, key, count)
    if kind == b"stream":
        return _free_stream(store.redis, key, count)
    return _free_hash(store.redis, key, count)


def _free_list(client, key, count):
    while True:
        pipe = client.pipeline(transaction=False)
        pipe.llen(key)
        pipe.ltrim(key, count, -1)
        length, _ = guarded(pipe.execute)
        if not length:
            return
        yield min(length, count)


def _free_zset(client, key, count):
    while n := guarded(client.zremrangebyrank, key, 0, count - 1):
        yield n


def _free_stream(client, key, count):
    """A deleted topic's history: its oldest `count` entries at a time (XTRIM MAXLEN to
    what is left after them: exact, and nothing is read)."""
    while length := guarded(client.xlen, key):
        guarded(lambda: client.xtrim(key, maxlen=max(0, length - count), approximate=False))
        yield min(length, count)
    guarded(client.delete, key)


def _free_hash(client, key, count):
    """HSCAN goes on from its cursor: nothing else writes a trash key."""
    cursor = None
    while cursor != 0:
        cursor, fields = guarded(lambda: client.hscan(key, cursor or 0, count=count))
        if fields:
            yield guarded(client.hdel, key, *fields)


def requeue_all(store: Store, topic: str, channel: str):
    """Requeue every message in flight at the start, whoever holds it. Redis keeps no
    delivery time (lib/inflight.lua), so the cut is the latest deadline in flight at
    the start: a later delivery has a later deadline (at equal msg timeouts), and so
    does a message its holder touched since, which is left to that holder."""
    progress = {"cut_ms": latest_deadline(store, topic, channel), "done": 0, "requeued": 0,
                "total": store.reads.read_channel(topic, channel)["in_flight_count"]}
    yield progress
    for entries in store.control.in_flight_entries(topic, channel, CHUNK):
        held = [member for member, deadline in entries if deadline <= progress["cut_ms"]]
        progress["requeued"] += sum(store.control.requeue_held(topic, channel, held))
        progress["done"] = min(progress["total"], progress["done"] + len(entries))
        yield progress


def latest_deadline(store: Store, topic: str, channel: str) -> int:
    """The latest deadline (Redis ms) in flight on any part of the channel; 0 if none."""
    latest = 0
    for part in store.parts(topic):
        key = ChannelKeys.of(part, channel).inflight
        last = guarded(lambda: store.redis.zrange(key, -1, -1, withscores=True))
        if last:
            latest = max(latest, int(last[0][1]))
    return latest


def replay(store: Store, topic: str, channel: str, starts: list[str], end: str = "+",
           cuts: list[int] | None = None):
    """Put the retained messages of each part from starts[part] (a message position
    "<ms>-<count>", or "-") to `end` (a stream id or ms, lib/history.lua) back in the
    channel's queue, in publish order, about history.REPLAY_CHUNK messages per call
    (replay.lua, whole entries); with `cuts` (a channel just created from the beginning)
    each part's messages up to its cut, each at the queue's head, newest first, so the
    queue ends in publish order. Messages in flight or deferred are skipped. The total
    is counted from the ids at the start. An ordered channel's is ordered_replay's."""
    parts = store.parts(topic)
    forward = cuts is None
    if forward and store.ordering.is_ordered(topic, channel):
        yield from ordered_replay(store, topic, channel, starts, end)
        return
    cuts = cuts or [0] * len(parts)
    progress = {"done": 0, "replayed": 0, "skipped": 0,
                "total": sum(store.history.range_size(p, s, end, c)
                             for p, s, c in zip(parts, starts, cuts))}
    yield progress
    for part, start, cut in zip(parts, starts, cuts):
        if not forward and cut == 0:
            continue    # nothing was published to that part before the channel was made
        low, high = start, end
        while True:
            done = store.run(store.history.replay_op(part, channel, low, high, forward, cut))
            if done is None:
                raise NotFound(f"channel {topic}/{channel} not found")
            progress["replayed"] += done.replayed
            progress["skipped"] += done.skipped
            progress["done"] = min(progress["total"], progress["done"] + done.read)
            yield progress
            if done.ended:
                break
            if forward:
                low = "(" + done.last
            else:
                high = "(" + done.last
    progress["done"] = progress["total"]
    yield progress


def replay_end(newest: str | None, end: str) -> str:
    """The end of an ordered channel's replay of a part: `end`, but no later than the
    part's newest entry at the start (`newest`)."""
    if newest is None:
        return end
    if end == "+" or int(newest.partition("-")[0]) <= int(end.partition("-")[0]):
        return newest
    return end


def ordered_replay(store: Store, topic: str, channel: str, starts: list[str], end: str):
    """replay() on an ordered channel (relay/store/ordering.py): the history keeps no
    order keys, so each message is given the key of the topic's rule, if it has one, and
    passes the channel's gate (it waits behind its key's message out, in id order with
    those waiting), or else none (it goes out in parallel: deliver's order). So that no
    id is on the channel twice, what the channel still holds is skipped: in flight,
    deferred or out for its key (redrive.lua checks, with the queueing), and waiting
    behind its key (the ids waiting at the start: no message starts waiting later, once
    published, and the replay stops at each part's newest entry at the start, so that
    what is published meanwhile is not replayed: it is delivered anyway)."""
    parts = store.parts(topic)
    ends = [replay_end(store.history.newest_entry(p), end) for p in parts]
    waiting = store.ordering.waiting_ids(topic, channel)
    progress = {"done": 0, "replayed": 0, "skipped": 0,
                "total": sum(store.history.range_size(p, s, e) for p, s, e in zip(parts, starts, ends))}
    yield progress
    for index, (part, start, high) in enumerate(zip(parts, starts, ends)):
        low = start
        while True:
            handed = store.run(store.history.replay_op(part, channel, low, high, hand_back=True))
            if handed is None:
                raise NotFound(f"channel {topic}/{channel} not found")
            done, read = handed
            records = [r for r in read if record_id(r) not in waiting]
            queued = store.run(deadletter.redrive_op(
                part, channel, records, store.node(part),
                deadletter.rule_keys(store, topic, index, records), counted=True)) \
                if records else 0
            if queued == codes.REDRIVE_NO_CHANNEL:
                raise NotFound(f"channel {topic}/{channel} not found")
            progress["replayed"] += queued
            progress["skipped"] += done.skipped + len(read) - queued
            progress["done"] = min(progress["total"], progress["done"] + done.read)
            yield progress
            if done.ended:
                break
            low = "(" + done.last
    progress["done"] = progress["total"]
    yield progress


OPERATIONS: dict[str, Callable[..., Iterator[dict]]] = {"empty": empty, "delete": delete, "requeue": requeue_all,
              "redrive": deadletter.redrive, "replay": replay}


def target(topic: str, channel: str) -> str:
    return f"{topic}/{channel}" if channel else topic


def run(store: Store, operation: str, topic: str, channel: str,
        report: Callable[[dict], None] = lambda progress: None,
        params: dict | None = None) -> dict:
    """Run an operation to its end in this process; returns its last progress."""
    progress: dict = {}
    for progress in OPERATIONS[operation](store, topic, channel, **(params or {})):
        report(progress)
    return {"operation": operation, "target": target(topic, channel), **progress}


def perform(operation: str, topic: str, channel: str, replication: dict | None = None,
            params: dict | None = None) -> dict:
    """The rq job: run the operation on the worker's Redis, progress in job.meta; a
    redrive's publishes wait for replicas as `replication` (Store.replication) says, as
    relay-admin's options did where it was queued. `params`: the operation's own."""
    job = get_current_job()
    assert job is not None      # rq runs it as a job
    store = Store(whole(job.connection), **(replication or {}))
    result = run(store, operation, topic, channel, MetaWriter(job), params)
    job.meta["progress"] = result
    job.save_meta()
    return result


class MetaWriter:
    """Saves progress to job.meta at most every SAVE_INTERVAL seconds."""

    def __init__(self, job: Job):
        self.job = job
        self.saved = 0.0

    def __call__(self, progress: dict) -> None:
        now = time.monotonic()
        if now - self.saved >= SAVE_INTERVAL:
            self.job.meta["progress"] = progress
            self.job.save_meta()
            self.saved = now


def enqueue(connection, operation: str, topic: str, channel: str,
            replication: dict | None = None, params: dict | None = None) -> Job:
    return Queue(QUEUE, connection=connection).enqueue(
        perform, operation, topic, channel, replication, params, job_timeout=-1,
        result_ttl=RESULT_TTL,
        description=f"{operation} {target(topic, channel)}",
        meta={"operation": operation, "target": target(topic, channel)})


def has_worker(connection) -> bool:
    return worker_count(connection) > 0


def worker_count(connection) -> int:
    """`relay jobs` workers alive on the queue."""
    return Worker.count(connection=connection, queue=Queue(QUEUE, connection=connection))


def find_job(connection, job_id: str) -> Job | None:
    """The queue's job of that id, if rq still keeps it."""
    try:
        job = Job.fetch(job_id, connection=connection)
    except NoSuchJobError:
        return None
    return job if job.origin == QUEUE else None


def all_jobs(connection) -> list[Job]:
    """The queue's jobs in every state rq keeps, oldest first."""
    queue = Queue(QUEUE, connection=connection)
    registries = [queue.started_job_registry, queue.finished_job_registry,
                  queue.failed_job_registry, queue.deferred_job_registry,
                  queue.scheduled_job_registry, queue.canceled_job_registry]
    ids = list(queue.get_job_ids())
    for registry in registries:
        ids += registry.get_job_ids()
    found = [j for j in Job.fetch_many(list(dict.fromkeys(ids)), connection) if j is not None]
    return sorted(found, key=lambda j: j.enqueued_at or j.created_at)
