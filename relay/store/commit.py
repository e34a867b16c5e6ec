"""Group commit: the Redis work of every connection of a broker, in few round trips.

Connections submit Ops and wait on their results; one greenlet sends whatever
has queued up as one pipeline. While a pipeline is in flight the next batch
builds up, so the batch grows with load. FIN, REQ and TOUCH calls on the same
channel are merged into one script call (their args are lists of items), up to
MAX_MERGED_ARGS: a flood of FINs makes many calls, never one Redis refuses.

A broker's commit is patient for --redis-timeout per op (Bounded): a client's PUB is
answered within it however long the lane's pipelines wait for an unreachable Redis.
"""

import logging
import time
from collections import deque
from typing import Any, Callable, NamedTuple, Protocol

import gevent
from gevent.event import AsyncResult, Event

from relay.errors import NoAnswer, OutcomeUnknown, StoreConnectionError, StoreError
from relay.store.causes import cause
from relay.store.connection import UNREACHABLE
from relay.store.runner import MAX_CALL_ARGS, Continued, Op
from relay.store.store import Store

log = logging.getLogger("relay.commit")

# script -> (number of leading args shared by a call, args per item)
MERGEABLE = {"finish": (0, 2), "requeue": (3, 3), "touch": (0, 3)}
# a merged call stops growing here, leaving room for the deliver call a finish folds into
MAX_MERGED_ARGS = MAX_CALL_ARGS // 2


class _Queued:
    """An op in a lane, and its result; `sent` once a pipeline took it: from then on
    Redis may run it, whether or not an answer comes back. `step`: the next call of a
    staged publish under way."""

    __slots__ = ("op", "result", "order", "step", "sent")

    def __init__(self, op: Op, result: "AsyncResult[Any]", order: int | None,
                 step: bool = False) -> None:
        self.op = op
        self.result = result
        self.order = order
        self.step = step
        self.sent = False


class Bounded:
    """An op's result that its waiter stops waiting for at the op's deadline. get() then
    fails: with StoreConnectionError if the lane had not sent the op yet (it skips it: it
    never runs), else with NoAnswer (Redis may still run it). Without it, an op queued
    behind a pipeline that waits out its socket timeout (a partition from Redis) would
    wait that timeout again for its own."""

    __slots__ = ("queued", "expires", "patience")

    def __init__(self, queued: _Queued, patience: float, since: float) -> None:
        self.queued = queued
        self.patience = patience
        self.expires = since + patience

    def get(self) -> Any:
        result = self.queued.result
        remaining = self.expires - time.monotonic()
        if remaining > 0 or result.ready():
            try:
                return result.get(timeout=max(0.0, remaining))
            except gevent.Timeout:
                pass
        waited = f"no answer from redis within {self.patience * 1000:.0f}ms"
        error = NoAnswer(waited) if self.queued.sent else StoreConnectionError(
            waited + " (not sent)")
        result.set_exception(error)
        raise error


class Submitted(Protocol):
    """What submit hands back (a gevent AsyncResult, or Bounded): get() waits for the op's
    parsed result, or raises its error. (gevent's stubs type AsyncResult.get() as maybe None, for
    a result set without a value; a lane sets each op's.)"""

    def get(self) -> Any: ...


class _All:
    """The results of several submitted ops as one (GroupCommit.submit_all_made)."""

    __slots__ = ("results",)

    def __init__(self, results: list[Submitted]) -> None:
        self.results = results

    def get(self) -> list:
        """Their values; else an error: OutcomeUnknown where some ops were done or may
        have been, else the first op's error."""
        values, errors = [], []
        for result in self.results:
            try:
                values.append(result.get())
            except StoreError as e:
                errors.append(e)
        if not errors:
            return values
        unknown = [e for e in errors if isinstance(e, OutcomeUnknown)]
        if unknown:
            raise unknown[0]
        if values:
            raise OutcomeUnknown(f"{errors[0]} ({len(values)} of {len(self.results)} calls "
                                 f"done)")
        raise errors[0]


class GroupCommit:
    """`lanes` pipelines may be in flight at once, each on its own connection. An op's
    `order` key picks its lane, so ops of the same key (a connection or a channel, as the
    caller chooses) stay in the order they were submitted; ops of no order (None: an HTTP
    publish, a lookup) go on lane 0 and keep none."""

    def __init__(self, store: Store, lanes: int = 1, max_batch: int = 2000,
                 observe: Callable[[float], object] | None = None,
                 patience: float | None = None) -> None:
        """`observe(seconds)` is told the time of each pipeline round trip; `patience`:
        the seconds an op's result is waited for at most (see Bounded), None: no bound."""
        stores = [store] + [store.sibling() for _ in range(lanes - 1)]
        self.quiet = False    # a stopping broker's: its stop says in one line what failed
        self.lanes = [_Lane(s, max_batch, observe, lambda: self.quiet) for s in stores]
        self.patience = patience

    def submit(self, op: Op, order: int | None = None,
               since: float | None = None) -> Submitted:
        """`since`: the time (monotonic) the patience counts from, if not now. Each call
        the op is known to make (op.calls: a big MPUB's stage calls and commit) has the
        patience: a 5 MB MPUB may take that much longer, and still gets an answer in
        bounded time."""
        queued = self.lanes[0 if order is None else order % len(self.lanes)].submit(op, order)
        if self.patience is None:
            return queued.result
        return Bounded(queued, self.patience * op.calls,
                       time.monotonic() if since is None else since)

    def submit_made(self, make: Callable[[], Op], order: int | None = None) -> Submitted:
        """Submit the op make() builds, its patience counting from before: what building
        it waits for (a topic's partition count, read through this commit) is part of
        the client's wait."""
        since = time.monotonic()
        return self.submit(make(), order, since)

    def submit_all_made(self, make: Callable[[], list[Op]],
                        order: int | None = None) -> Submitted:
        """submit_made for the ops make() builds (a keyed publish's, one per part it
        reaches): one result, the list of theirs; the first error raises."""
        since = time.monotonic()
        return _All([self.submit(op, order, since) for op in make()])

    def call(self, op: Op, order: int | None = None) -> Any:
        """Submit and wait; raises the op's error."""
        return self.submit(op, order).get()

    def stop(self) -> None:
        for lane in self.lanes:
            lane.greenlet.kill()


class _Lane:
    """Sends what is queued, a pipeline at a time. A staged publish goes on a step per
    pipeline, beside the others' ops, so it holds up no one but the later ops of its
    own order (they wait for its last step, so a connection's publishes stay in order)."""

    def __init__(self, store: Store, max_batch: int,
                 observe: Callable[[float], object] | None = None,
                 quiet: Callable[[], bool] = lambda: False) -> None:
        self.store = store
        self.quiet = quiet
        self.max_batch = max_batch
        self.observe = observe
        self._queue: deque[_Queued] = deque()
        self._stepping: set[int | None] = set()     # orders whose staged publish is under way
        self._ready = Event()
        self.greenlet = gevent.spawn(self._loop)

    def submit(self, op: Op, order: int | None = None) -> _Queued:
        queued = _Queued(op, AsyncResult(), order)
        self._queue.append(queued)
        self._ready.set()
        return queued

    def _loop(self) -> None:
        while True:
            self._ready.wait()
            self._ready.clear()
            while batch := self._next_batch():
                self._run(batch)

    def _next_batch(self) -> list[_Queued]:
        """Up to max_batch queued ops, in order, less those whose waiter gave up on them
        (Bounded: never sent) and those held behind a staged publish of their order."""
        batch: list[_Queued] = []
        held: list[_Queued] = []
        while self._queue and len(batch) < self.max_batch:
            item = self._queue.popleft()
            if item.result.ready():
                if item.step:
                    self._stepping.discard(item.order)
            elif item.order in self._stepping and not item.step:
                held.append(item)
            else:
                item.sent = True
                batch.append(item)
                if item.op.then is not None and item.order is not None:
                    self._stepping.add(item.order)  # a staged publish: it may go on
        self._queue.extendleft(reversed(held))
        return batch

    def _run(self, batch: list[_Queued]) -> None:
        ops, slices = _merge([item.op for item in batch])
        started = time.perf_counter()
        try:
            results = self.store.run_many(ops, follow=False)
            if self.observe is not None:
                self.observe(time.perf_counter() - started)
        except (StoreConnectionError,) + UNREACHABLE as e:  # a cluster's too
            if not self.quiet():
                log.warning("redis unreachable: %s", cause(e))
            # the runner says which it had not sent; one raised past it may have been
            error = e if isinstance(e, StoreConnectionError) else NoAnswer(str(e))
            results = [error] * len(ops)
        except StoreError as e:     # refused before any call ran: a new connection's PING
            log.warning("redis refused the pipeline: %s", e)    # under MISCONF, say
            results = [e] * len(ops)
        except Exception as e:  # never let one batch stop the lane
            log.exception("pipeline failed")
            results = [OutcomeUnknown(f"pipeline failed: {e!r}")] * len(ops)
        going_on = []
        for (op_index, start, stop, part), item in zip(slices, batch):
            value, result = results[op_index], item.result
            if isinstance(value, Continued):
                going_on.append(_Queued(value.op, result, item.order, True))
                continue
            if item.op.then is not None:
                self._stepping.discard(item.order)
            if result.ready():
                continue    # its waiter gave up on it meanwhile
            if isinstance(value, Exception):
                result.set_exception(value)
                continue
            if part is not None:
                value = getattr(value, part)
            result.set(value if start is None else value[start:stop])
        self._queue.extendleft(reversed(going_on))


def _merge(ops: list) -> tuple[list, list]:
    """Merge mergeable ops on the same keys, then fold finishes into delivers; slices map
    each input op to its results: (merged op index, start, stop, attribute or None)."""
    merged, slices = _merge_items(ops)
    return _fold_finishes(merged, slices)


def _merge_items(ops: list) -> tuple[list, list]:
    """Merge mergeable ops on the same keys into one call with all their items."""
    merged: list[Op] = []
    slices = []
    open_calls: dict = {}
    for op in ops:
        shape = MERGEABLE.get(op.script)
        if shape is None:
            slices.append((len(merged), None, None))
            merged.append(op)
            continue
        shared, stride = shape
        key = (op.script, tuple(op.keys), tuple(op.args[:shared]))
        items = list(op.args[shared:])
        index, count = open_calls.get(key, (None, 0))
        if index is not None and len(merged[index].args) + len(items) <= MAX_MERGED_ARGS:
            merged[index].args.extend(items)
        else:
            index, count = len(merged), 0
            merged.append(op._replace(args=list(op.args)))
        n = len(items) // stride
        slices.append((index, count, count + n))
        open_calls[key] = (index, count + n)
    return merged, slices


def _fold_finishes(merged: list, slices: list) -> tuple[list, list]:
    """Fold each finish call into the deliver call of its channel that follows it, when
    nothing but publishes touches that channel in between: one script call then frees
    RDY credit and uses it (Store.finishing_first). Slices of a folded finish read the
    deliver's codes (Delivered.finished)."""
    into: dict[int, int] = {}       # folded finish index -> deliver index
    waiting: dict[str, int] = {}    # a channel's inflight key -> its finish call's index
    for i, op in enumerate(merged):
        if op.script == "finish":
            waiting[op.keys[0]] = i
        elif op.script == "deliver" and op.keys[1] in waiting:
            j = waiting.pop(op.keys[1])
            into[j] = i
            merged[i] = Store.finishing_first(op, merged[j])
        elif op.script != "publish" and waiting:
            for key in [k for k in waiting if k in op.keys]:
                del waiting[key]
    if not into:
        return merged, [(*s, None) for s in slices]
    kept = [i for i in range(len(merged)) if i not in into]
    position = {old: new for new, old in enumerate(kept)}
    folded = [(position[into[i]], start, stop, "finished") if i in into
              else (position[i], start, stop, None) for i, start, stop in slices]
    return [merged[i] for i in kept], folded
