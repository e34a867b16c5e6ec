"""Group commit: the Redis work of every connection of a broker, in few round trips.

Connections submit Ops and wait on their results; one greenlet sends whatever
has queued up as one pipeline. While a pipeline is in flight the next batch
builds up, so the batch grows with load. The batchers (relay/store/batchers.py) make
the pipeline's calls: FIN, REQ and TOUCH calls on the same channel merged into one
script call, small publishes to one part into one, FINs folded into the deliver call of
their channel that follows them, and those left of one part's channels merged into
finish_many calls.

A broker's commit is patient for --redis-timeout per op (_Queued.give_up): a PUB is
answered within it however long the lane's pipelines wait for an unreachable Redis.
"""

import logging
import time
from collections import Counter, deque
from typing import Any, Callable, Protocol

import gevent
from gevent.event import AsyncResult, Event

from relay.deadlines import Deadlines
from relay.errors import NoAnswer, OutcomeUnknown, StoreConnectionError, StoreError
from relay.store.causes import cause
from relay.store.connection import UNREACHABLE
from relay.store.batchers import answers
from relay.store.runner import Continued, Op
from relay.store.store import Store

log = logging.getLogger("relay.commit")
INFINITY = float("inf")


class _Queued:
    """An op in a lane, and its result; `sent` once a pipeline took it: from then on
    Redis may run it, whether or not an answer comes back. `step`: the next call of a
    staged publish under way. `expires`: when its waiter stops waiting (monotonic; None:
    never), which its lane keeps (_Lane.expire)."""

    __slots__ = ("op", "result", "order", "step", "sent", "expires", "patience")

    def __init__(self, op: Op, result: "AsyncResult[Any]", order: int | None,
                 step: bool = False, expires: float | None = None,
                 patience: float = 0.0) -> None:
        self.op = op
        self.result = result
        self.order = order
        self.step = step
        self.sent = False
        self.expires = expires
        self.patience = patience

    def give_up(self) -> None:
        """Fail the result at its deadline: StoreConnectionError if no pipeline took it
        yet (its lane then skips it: it never runs), else NoAnswer (Redis may still run
        it). Without it, an op queued behind a pipeline that waits out its socket timeout
        (a partition from Redis) would wait that timeout again for its own."""
        waited = f"no answer from redis within {self.patience * 1000:.0f}ms"
        self.result.set_exception(NoAnswer(waited) if self.sent else
                                  StoreConnectionError(waited + " (not sent)"))


class Submitted(Protocol):
    """A submitted op's result (a gevent AsyncResult), or several as one (_All): get()
    waits for the parsed result, or raises its error (at the op's deadline, its lane's
    doing). (gevent's stubs type AsyncResult.get() as maybe None, for a result set
    without a value; a lane sets each op's.)"""

    def get(self) -> Any: ...


class Linked(Submitted, Protocol):
    """What submit hands back: also told to call back once ready (AsyncResult.rawlink:
    from the hub, with the result), for an answer written without a wait."""

    def rawlink(self, callback: Callable[[Any], None]) -> None: ...


class _All:
    """The results of several submitted ops as one (GroupCommit.submit_all)."""

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
    caller chooses) stay in the order they were submitted; ops of no order (None: a
    lookup) go on lane 0 and keep none. An op's own lane key (Op.lane: a small publish's
    topic part) overrides the order's choice: the small publishes of every connection to
    a part meet on its lane and merge; an order's ops stay on one lane while any is
    unanswered, so they keep its order all the same."""

    def __init__(self, store: Store, lanes: int = 1, max_batch: int = 2000,
                 observe: Callable[[float], object] | None = None,
                 patience: float | None = None,
                 deadlines: Deadlines | None = None) -> None:
        """`observe(seconds)` is told the time of each pipeline round trip; `patience`:
        the seconds an op's result is waited for at most (_Queued.give_up), None: no bound;
        `deadlines`: who keeps them (the broker's)."""
        stores = [store] + [store.sibling() for _ in range(lanes - 1)]
        self.quiet = False    # a stopping broker's: its stop says in one line what failed
        self.calls: Counter[str] = Counter()    # script calls sent, by script (/metrics)
        self._on: dict[int, list[int]] = {}     # order -> [its lane, its ops there]
        self.patience = patience
        self.deadlines = Deadlines() if deadlines is None else deadlines
        self.lanes = [_Lane(s, max_batch, observe, lambda: self.quiet, self.calls,
                            self._settled, self.deadlines) for s in stores]

    def submit(self, op: Op, order: int | None = None,
               since: float | None = None) -> "Linked":
        """`since`: the time (monotonic) the patience counts from, if not now. Each call
        the op is known to make (op.calls: a big MPUB's stage calls and commit) has the
        patience: a 5 MB MPUB may take that much longer, and still gets an answer in
        bounded time."""
        lane = self.lanes[self._lane_index(op, order)]
        if self.patience is None:
            return lane.submit(op, order).result
        patience = self.patience * op.calls
        expires = (time.monotonic() if since is None else since) + patience
        return lane.submit(op, order, expires, patience).result

    def _lane_index(self, op: Op, order: int | None) -> int:
        """The op's lane: its own lane key's, else its order's; but while ops of its
        order are still on a lane (not answered), that one, so an order's ops run in the
        order submitted: a connection's PUB merged on its topic part's lane and the MPUB
        it pipelines after it, which goes on the connection's lane."""
        key = order if op.lane is None else hash(op.lane)
        index = 0 if key is None else key % len(self.lanes)
        if order is None:
            return index
        on = self._on.setdefault(order, [index, 0])
        on[1] += 1
        return on[0]

    def _settled(self, order: int | None) -> None:
        """An op of `order` left its lane: answered, failed or given up on."""
        if order is None or order not in self._on:
            return
        on = self._on[order]
        on[1] -= 1
        if on[1] <= 0:
            del self._on[order]

    def submit_all(self, ops: list[Op], order: int | None = None,
                   since: float | None = None) -> Submitted:
        """submit for each op (a keyed publish's, one per part it reaches): one result,
        the list of theirs; the first error raises."""
        return _All([self.submit(op, order, since) for op in ops])

    def call(self, op: Op, order: int | None = None) -> Any:
        """Submit and wait; raises the op's error."""
        return self.submit(op, order).get()

    def stop(self) -> None:
        for lane in self.lanes:
            lane.greenlet.kill()


class _Lane:
    """Sends what is queued, a pipeline at a time. A staged publish goes on a step per
    pipeline, beside the others' ops, so it holds up no one but the later ops of its
    own order (they wait for its last step, so a connection's publishes stay in order).

    It keeps its ops' deadlines itself (expire), watched by the broker's Deadlines at
    the earliest: one watch a lane, not one an op, which cost a PUB more than its wait."""

    def __init__(self, store: Store, max_batch: int,
                 observe: Callable[[float], object] | None = None,
                 quiet: Callable[[], bool] = lambda: False,
                 calls: "Counter[str] | None" = None,
                 settled: Callable[[int | None], None] = lambda order: None,
                 deadlines: Deadlines | None = None) -> None:
        self.store = store
        self.batchers = store.runner.batchers
        self.calls = Counter() if calls is None else calls
        self.settled = settled
        self.quiet = quiet
        self.max_batch = max_batch
        self.observe = observe
        self._queue: deque[_Queued] = deque()
        self._running: list[_Queued] = []           # the pipeline in flight
        self._stepping: set[int | None] = set()     # orders whose staged publish is under way
        self._ready = Event()
        self.deadlines = Deadlines() if deadlines is None else deadlines
        store.runner.deadlines = self.deadlines     # its connection's reads (resp.Replies)
        self.expires = INFINITY     # the deadline it is watched at (none: not watched)
        self.greenlet = gevent.spawn(self._loop)

    def submit(self, op: Op, order: int | None = None, expires: float | None = None,
               patience: float = 0.0) -> _Queued:
        """`expires`: the op's deadline (monotonic), `patience` its length."""
        queued = _Queued(op, AsyncResult(), order, expires=expires, patience=patience)
        self._queue.append(queued)
        self._ready.set()
        if expires is not None and expires < self.expires:
            if expires <= time.monotonic():
                queued.give_up()    # its lane skips it
            else:
                self._watch(expires)
        return queued

    def _watch(self, expires: float) -> None:
        self.deadlines.unwatch(self)
        self.expires = expires
        self.deadlines.watch(self)

    def expire(self) -> None:
        """The earliest deadline came (Deadlines): fail each op past its own, then watch
        for the next one's."""
        now, earliest = time.monotonic(), INFINITY
        self.expires = INFINITY
        for item in (*self._running, *self._queue):
            if item.expires is None or item.result.ready():
                continue
            if item.expires <= now:
                item.give_up()
            elif item.expires < earliest:
                earliest = item.expires
        if earliest < INFINITY:
            self._watch(earliest)

    def _loop(self) -> None:
        """It waits for nothing to fill a batch: what queued while the last pipeline was
        in flight goes at once. (A yield to the hub after each pipeline let more FINs
        meet the deliver their answer sets off, at 4 consumers of RDY 1 31.6 against
        38.1 µs of Redis per message, but cost 10% of their rate: scripts/compare.py.)"""
        while True:
            self._ready.wait()
            self._ready.clear()
            while batch := self._next_batch():
                self._run(batch)

    def _next_batch(self) -> list[_Queued]:
        """Up to max_batch queued ops, in order, less those given up on (_Queued.give_up:
        they never run) and those held behind a staged publish of their order."""
        batch: list[_Queued] = []
        held: list[_Queued] = []
        while self._queue and len(batch) < self.max_batch:
            item = self._queue.popleft()
            if item.result.ready():
                if item.step:
                    self._stepping.discard(item.order)
                self.settled(item.order)
            elif item.order in self._stepping and not item.step:
                held.append(item)
            else:
                item.sent = True
                batch.append(item)
                if item.order is not None and self.batchers.goes_on(item.op):
                    self._stepping.add(item.order)  # a staged publish: it may go on
        self._queue.extendleft(reversed(held))
        return batch

    def _run(self, batch: list[_Queued]) -> None:
        self._running = batch
        try:
            self._answer(batch, self._call(batch))
        finally:
            self._running = []

    def _call(self, batch: list[_Queued]) -> list:
        """The pipeline of the batch's calls: each op's value, or its error."""
        calls = self.batchers.calls([item.op for item in batch],
                                    [item.order for item in batch])
        self.calls.update(call.op.script for call in calls)
        started = time.perf_counter()
        try:
            results = self.store.run_many([call.op for call in calls], follow=False)
            if self.observe is not None:
                self.observe(time.perf_counter() - started)
        except (StoreConnectionError,) + UNREACHABLE as e:  # a cluster's too
            if not self.quiet():
                log.warning("redis unreachable: %s", cause(e))
            # the runner says which it had not sent; one raised past it may have been
            error = e if isinstance(e, StoreConnectionError) else NoAnswer(str(e))
            results = [error] * len(calls)
        except StoreError as e:     # refused before any call ran: a new connection's PING
            log.warning("redis refused the pipeline: %s", e)    # under MISCONF, say
            results = [e] * len(calls)
        except Exception as e:  # never let one batch stop the lane
            log.exception("pipeline failed")
            results = [OutcomeUnknown(f"pipeline failed: {e!r}")] * len(calls)
        return answers(calls, results, len(batch))

    def _answer(self, batch: list[_Queued], values: list) -> None:
        going_on = []
        for value, item in zip(values, batch):
            result = item.result
            if isinstance(value, Continued):
                going_on.append(_Queued(value.op, result, item.order, True, item.expires,
                                        item.patience))
                continue
            if self.batchers.goes_on(item.op):
                self._stepping.discard(item.order)
            self.settled(item.order)
            if result.ready():
                continue    # its waiter gave up on it meanwhile
            if isinstance(value, Exception):
                result.set_exception(value)
            else:
                result.set(value)
        self._queue.extendleft(reversed(going_on))
