"""Group commit: merging FIN/REQ/TOUCH calls, and GroupCommit answering each submit."""

import time
from types import SimpleNamespace

import fakeredis
import gevent
import pytest
import redis

from relay.broker.publishing import Publishing
from relay.codec import parse_record
from relay.errors import NoAnswer, OutcomeUnknown, StoreConnectionError, StoreError
from relay.store import Store
from relay.deadlines import Deadlines
from relay.store.batchers import MANY_FINISHES, MAX_MERGED_ARGS, answers
from relay.store.commit import GroupCommit
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.runner import MAX_CALL_ARGS
from tests.helpers.store import mid
from tests.helpers.wait import wait_for


@pytest.fixture
def fake_store():
    return Store(fakeredis.FakeRedis())


def calls_of(ops):
    """The pipeline's calls the batchers make of the ops (relay/store/batchers.py)."""
    return Store(fakeredis.FakeRedis()).runner.batchers.calls(ops)


def merge(ops):
    """The merged calls' ops, and what each input op gets from their results, as
    GroupCommit._run hands it out."""
    calls = calls_of(ops)
    return [call.op for call in calls], lambda results: answers(calls, results, len(ops))


def carried(ops):
    """Per merged call, the input ops it answers (their indexes), and from which part."""
    return [[(members, part) for members, _, part in call.answers] for call in calls_of(ops)]


# -- the batchers' calls ----------------------------------------------------------------------

def test_only_fin_req_touch_and_small_publishes_merge(fake_store):
    s = fake_store
    mergeable = [s.finish_op("t", "c", [("a", "1")]),
                 s.requeue_op("t", "c", [("a", "1", 0)]),
                 s.touch_op("t", "c", [("a", "1", 1)]),
                 s.publish_op("t", [b"x"]),
                 s.publish_op("t", [b"x"] * 16, defer_ms=10),
                 s.publish_op("t", [b"x"], publish_keys=[b"k"])]
    alone = [s.publish_op("t", [b"x"] * 17),
             s.publish_op("t", [b"x"] * 5001),
             s.deliver_op("t", "c", [("a", 1, 1)]),
             s.subscribe_op("t", "c", "b1"),
             s.scan_op("t", "c", 10)]
    assert all(op.merge is not None for op in mergeable)
    assert [op.merge for op in alone] == [None] * 5
    assert {op.lane for op in mergeable[3:]} == {"t"} and {op.lane for op in alone} == {None}


def test_finish_ops_on_one_channel_become_one_call(fake_store):
    s = fake_store
    ops = [s.finish_op("t", "c", [("a", "1")]),
           s.finish_op("t", "c", [("b", "2"), ("b", "3")]),
           s.finish_op("t", "c", [("c", "4")])]
    original_args = [list(op.args) for op in ops]
    merged, answer = merge(ops)
    assert len(merged) == 1
    assert merged[0].script == "finish"
    assert list(merged[0].keys) == list(ops[0].keys)
    assert list(merged[0].args) == ["c", "relay:{t}:wake", "relay:", "a", "1", "b", "2", "b", "3", "c", "4"]
    assert carried(ops) == [[([0, 1, 2], None)]]
    # the submitted ops are not changed
    assert [list(op.args) for op in ops] == original_args
    assert answer([[1, 0, -1, 1]]) == [[1], [0, -1], [1]]


def test_merged_calls_stop_growing_at_the_bound(fake_store):
    """A flood of FINs (here 640,000 in ops of 128, as the reader gathers them) makes
    many calls of at most MAX_MERGED_ARGS, each FIN in exactly one of them in order:
    merged without a limit they made one call that Redis closes the connection on."""
    s = fake_store
    ops = [s.finish_op("t", "c", [("a", mid(i)) for i in range(j * 128, (j + 1) * 128)])
           for j in range(5000)]
    merged, answer = merge(ops)
    assert {op.script for op in merged} == {"finish"}
    assert max(len(op.keys) + len(op.args) for op in merged) <= MAX_CALL_ARGS
    per_call = MAX_MERGED_ARGS // (128 * 2)      # whole ops
    assert len(merged) == -(-5000 // per_call)
    codes = [[i for i in range((len(op.args) - 3) // 2)] for op in merged]
    got = answer(codes)
    assert [len(g) for g in got] == [128] * 5000
    assert [a for op in merged for a in op.args[4::2]] == [mid(i) for i in range(640_000)]


def test_requeue_ops_share_their_three_leading_args(fake_store):
    s = fake_store
    ops = [s.requeue_op("t", "c", [("a", "1", 0)]),
           s.requeue_op("t", "c", [("b", "2", 100), ("b", "3", 0)])]
    merged, answer = merge(ops)
    assert len(merged) == 1
    leading = list(ops[0].args[:3])
    assert leading == list(ops[1].args[:3]) == ["c", "relay:{t}:wake", "relay:"]
    assert list(merged[0].args) == leading + ["a", "1", 0, "b", "2", 100, "b", "3", 0]
    assert answer([[1, 1, 0]]) == [[1], [1, 0]]


def test_touch_ops_of_one_channel_merge(fake_store):
    s = fake_store
    ops = [s.touch_op("t", "c", [("a", "1", 60_000)]),
           s.touch_op("t", "c2", [("b", "2", 60_000)]),
           s.touch_op("t", "c", [("c", "3", 1_000), ("c", "4", 2_000)])]
    merged, answer = merge(ops)
    assert len(merged) == 2
    assert list(merged[0].args) == ["a", "1", 60_000, "c", "3", 1_000, "c", "4", 2_000]
    assert list(merged[1].args) == ["b", "2", 60_000]
    assert carried(ops) == [[([0, 2], None)], [([1], None)]]
    assert answer([[11, 13, 14], [12]]) == [[11], [12], [13, 14]]


def test_different_keys_are_not_merged(fake_store):
    """FINs of one channel merge into one call; those of different channels of one part
    into one finish_many call (below); other parts' stay apart."""
    s = fake_store
    ops = [s.finish_op("t", "c1", [("a", "1")]),
           s.finish_op("t", "c2", [("a", "1")]),
           s.finish_op("u", "c1", [("a", "1")]),
           s.requeue_op("t", "c1", [("a", "1", 0)]),
           s.finish_op("t", "c1", [("a", "2")])]
    merged, answer = merge(ops)
    assert [op.script for op in merged] == ["finish_many", "finish", "requeue"]
    assert list(merged[0].args)[2:] == ["c1", 2, "a", "1", "a", "2", "c2", 1, "a", "1"]
    assert list(merged[1].args)[3:] == ["a", "1"]
    assert list(merged[2].args) == list(ops[3].args)
    assert carried(ops) == [[([0, 4], None), ([1], None)], [([2], None)], [([3], None)]]
    assert answer([[[1, -1], [0]], [1], [1]]) == [[1], [0], [1], [1], [-1]]


def test_finishes_of_a_parts_channels_become_one_call(fake_store):
    """A wide topic's consumers each FIN on their own channel: one finish_many call per
    MANY_FINISHES channels of a part, where the first FIN stands. A FIN whose channel a
    call between touched (a REQ here) does not overtake it: it starts the next call."""
    s = fake_store
    ops = [s.finish_op("t", f"c{i}", [("a", str(i))]) for i in range(MANY_FINISHES + 6)]
    ops.insert(3, s.requeue_op("t", "c4", [("a", "x", 0)]))
    ops.insert(4, s.publish_op("t", [b"x"], timestamp_ns=1))
    merged, answer = merge(ops)
    assert [op.script for op in merged] == ["finish_many", "requeue", "publish",
                                            "finish_many", "finish_many"]
    assert list(merged[0].keys[:9]) == [TopicKeys.of("t").due, TopicKeys.of("t").version,
                                        *ops[0].keys[:7]]
    assert [list(op.args)[2::4] for op in (merged[0], merged[4])] == [
        ["c0", "c1", "c2", "c3"], [f"c{MANY_FINISHES + 4}", f"c{MANY_FINISHES + 5}"]]
    assert len(merged[3].keys) == 2 + 9 * MANY_FINISHES
    assert answer([[[1]] * 4, [1], 1, [[0]] + [[1]] * (MANY_FINISHES - 1), [[1], [-1]]]) == (
        [[1]] * 3 + [[1], 1, [1], [0]] + [[1]] * MANY_FINISHES + [[-1]])


def test_another_parts_calls_do_not_keep_finishes_apart(fake_store):
    """What touches another part's keys (a deliver of topic u) cannot be overtaken in a
    way that matters: t's FINs around it still merge."""
    s = fake_store
    ops = [s.finish_op("t", "c1", [("a", "1")]),
           s.deliver_op("u", "c1", [("a", 1_000, 1)]),
           s.requeue_op("u", "c2", [("a", "2", 0)]),
           s.finish_op("t", "c2", [("a", "3")])]
    merged, _ = merge(ops)
    assert [op.script for op in merged] == ["finish_many", "deliver", "requeue"]


def test_merged_finishes_of_many_channels_run_as_alone(backend):
    """finish_many, on every backend, gives each channel's FINs what their own call
    would: taken, not in flight, another's."""
    s = Store(backend)
    for channel in ("c", "d"):
        s.subscribe("t", channel, "b1")
    s.publish("t", [b"1", b"2"])
    s.deliver("t", "c", [("a", 60_000, 2)])
    s.deliver("t", "d", [("b", 60_000, 2)])
    ops = [s.finish_op("t", "c", [("a", mid(1)), ("b", mid(2))]),
           s.finish_op("t", "d", [("b", mid(2)), ("b", mid(9))])]
    merged, answer = merge(ops)
    assert [op.script for op in merged] == ["finish_many"]
    assert answer(s.run_many(merged)) == [[1, -1], [1, 0]]
    assert [(st["in_flight_count"], st["depth"]) for st in
            (s.reads.read_channel("t", "c"), s.reads.read_channel("t", "d"))] == [(1, 0), (1, 0)]


def test_ops_that_cannot_merge_are_untouched(fake_store):
    s = fake_store
    ops = [s.publish_op("t", [b"x"] * 6000, timestamp_ns=1),
           s.finish_op("t", "c", [("a", "1")]),
           s.publish_op("u", [b"y"], timestamp_ns=1),
           s.deliver_op("t", "d", [("a", 1_000, 5)]),
           s.deliver_op("t", "d", [("b", 1_000, 5)]),
           s.subscribe_op("t", "c", "b1"),
           s.scan_op("t", "c", 10),
           s.finish_op("t", "c", [("b", "2")])]
    merged, answer = merge(ops)
    assert merged[0] == ops[0]
    assert [merged[i] for i in (3, 4, 5, 6)] == [ops[3], ops[4], ops[5], ops[6]]
    # a small publish is built where it is sent, alone too (the channel list known then)
    assert (ops[2].keys, ops[2].args) == ((), ())
    assert (merged[2].script, merged[2].keys[0], merged[2].args[-1]) == (
        "publish", "relay:{u}:ids", b"y")
    assert merged[1].script == "finish" and list(merged[1].args) == ["c", "relay:{t}:wake", "relay:", "a", "1", "b", "2"]
    assert len(merged) == 7
    assert carried(ops) == [[([0], None)], [([1, 7], None)], [([2], None)], [([3], None)],
                            [([4], None)], [([5], None)], [([6], None)]]
    results = [7, [1, 0], 8, [[b"r"]], [[]], True, (0, 0, -1)]
    assert answer(results) == [7, [1], 8, [[b"r"]], [[]], True, (0, 0, -1), [0]]


def test_finishes_fold_into_the_deliver_of_their_channel_that_follows(fake_store):
    """FINs then a deliver of the same channel, with only a publish between: one deliver
    call that finishes first; each FIN op reads its codes from the deliver's reply (a FIN
    after the deliver merged into the first FIN's call already, as before)."""
    s = fake_store
    deliver = s.deliver_op("t", "c", [("a", 1_000, 2), ("b", 1_000, 1)], max_attempts=5)
    ops = [s.finish_op("t", "c", [("a", "1")]),
           s.publish_op("t", [b"x"], timestamp_ns=1),
           s.finish_op("t", "c", [("b", "2"), ("b", "3")]),
           deliver,
           s.finish_op("t", "c", [("a", "4")])]
    merged, _ = merge(ops)
    assert [op.script for op in merged] == ["publish", "deliver"]
    assert list(merged[1].args) == ["c", 5, 4, "a", "1", "b", "2", "b", "3", "a", "4",
                                    "a", 1_000, 2, 0, "b", 1_000, 1, 0, 0, 0,
                                    "relay:{t}:wake", "relay:"]
    assert list(deliver.args) == ["c", 5, 0, "a", 1_000, 2, 0, "b", 1_000, 1, 0, 0, 0,
                                  "relay:{t}:wake", "relay:"]
    assert carried(ops) == [[([1], None)], [([3], None), ([0, 2, 4], "finished")]]


@pytest.mark.parametrize("between", ["requeue", "touch", "drop"])
def test_finishes_do_not_fold_past_another_change_of_their_channel(fake_store, between):
    """A FIN moved after a REQ, TOUCH or empty of its channel could change their answers."""
    s = fake_store
    other = {"requeue": lambda: s.requeue_op("t", "c", [("a", "1", 0)]),
             "touch": lambda: s.touch_op("t", "c", [("a", "1", 60_000)]),
             "drop": lambda: s.control.drop_op("t", "c")}[between]()
    ops = [s.finish_op("t", "c", [("a", "1")]), other, s.deliver_op("t", "c", [("a", 1, 1)])]
    merged, _ = merge(ops)
    assert [op.script for op in merged] == ["finish", other.script, "deliver"]
    assert carried(ops) == [[([0], None)], [([1], None)], [([2], None)]]


def test_merge_of_nothing():
    assert calls_of([]) == []


def test_merged_call_runs_as_the_separate_calls_would(fake_store):
    """The merged script call, on Redis, gives each op the results it would get alone."""
    s = fake_store
    s.subscribe("t", "c", "b1")
    s.publish("t", [b"1", b"2", b"3", b"4"])
    s.deliver("t", "c", [("a", 60_000, 2), ("b", 60_000, 2)])
    ops = [s.finish_op("t", "c", [("a", mid(1))]),
           s.finish_op("t", "c", [("a", mid(3)), ("b", mid(3))]),
           s.requeue_op("t", "c", [("b", mid(4), 0)]),
           s.requeue_op("t", "c", [("a", mid(2), 0), ("a", mid(9), 0)])]
    merged, answer = merge(ops)
    assert len(merged) == 2
    assert answer(s.run_many(merged)) == [[1], [-1, 1], [1], [1, 0]]
    state = s.reads.read_channel("t", "c")
    assert (state["depth"], state["in_flight_count"], state["requeue_count"]) == (2, 0, 2)


def test_folded_call_runs_as_the_separate_calls_would(backend):
    """A deliver with FINs folded in, on every backend: the FINs take (or fail) as alone,
    before the pops, and the credit they freed is used in the same call."""
    s = Store(backend)
    s.subscribe("t", "c", "b1")
    s.publish("t", [b"1", b"2", b"3"])
    s.deliver("t", "c", [("a", 60_000, 1), ("b", 60_000, 1)])
    ops = [s.finish_op("t", "c", [("a", mid(1)), ("a", mid(2)), ("a", mid(9))]),
           s.deliver_op("t", "c", [("a", 60_000, 2)])]
    merged, answer = merge(ops)
    assert [op.script for op in merged] == ["deliver"]
    finished, delivered = answer(s.run_many(merged))
    assert finished == [1, -1, 0]
    assert [parse_record(r)[2] for r in delivered[0]] == [mid(3)]
    state = s.reads.read_channel("t", "c")
    assert (state["depth"], state["in_flight_count"]) == (0, 2)


# -- GroupCommit under gevent ------------------------------------------------------

class Recorder:
    """Wraps Store.run_many to record how many ops each pipeline carried."""

    def __init__(self, store):
        self.batches = []
        self._run_many = store.run_many
        store.run_many = self

    def __call__(self, ops, follow=True):
        self.batches.append([op.script for op in ops])
        return self._run_many(ops, follow)


@pytest.fixture
def commit(fake_store):
    gc = GroupCommit(fake_store)
    yield gc
    gc.stop()


def test_concurrent_submits_are_merged_and_answered(fake_store, commit):
    s = fake_store
    n = 40
    s.subscribe("t", "c", "b1")
    s.publish("t", [b"%d" % i for i in range(n)])
    # client i owns message i + 1
    for i in range(n):
        assert len(s.deliver("t", "c", [(f"client{i}", 60_000, 1)])[0]) == 1
    recorder = Recorder(s)
    sec, usec = s.redis.time()
    before = sec * 1000 + usec // 1000

    def fin(i):
        return commit.call(s.finish_op("t", "c", [(f"client{i}", mid(i + 1))]))

    def fin_wrong_owner(i):
        return commit.call(s.finish_op("t", "c", [("intruder", mid(i + 1))]))

    def touch(i):
        return commit.call(s.touch_op("t", "c", [(f"client{i}", mid(i + 1), 1_000)]))

    def pub():
        return commit.call(s.publish_op("t", [b"new"]))

    jobs = []
    for i in range(n):
        if i % 4 == 0:
            jobs.append((i, "req", gevent.spawn(
                commit.call, s.requeue_op("t", "c", [(f"client{i}", mid(i + 1), 0)]))))
        elif i % 4 == 1:
            jobs.append((i, "touch", gevent.spawn(touch, i)))
        elif i % 4 == 2:
            jobs.append((i, "wrong", gevent.spawn(fin_wrong_owner, i)))
        else:
            jobs.append((i, "fin", gevent.spawn(fin, i)))
    jobs.append((None, "pub", gevent.spawn(pub)))
    jobs.append((None, "unknown", gevent.spawn(
        commit.call, s.finish_op("t", "c", [("client0", mid(999))]))))
    gevent.joinall([g for _, _, g in jobs], timeout=10, raise_error=True)
    sec, usec = s.redis.time()
    after = sec * 1000 + usec // 1000

    for i, kind, g in jobs:
        assert g.successful(), (i, kind, g.exception)
        value = g.value
        if kind == "req" or kind == "fin":
            assert value == [1], (i, kind)
        elif kind == "wrong":
            assert value == [-1], i
        elif kind == "touch":
            assert len(value) == 1 and before + 1_000 <= value[0] <= after + 1_000, i
        elif kind == "pub":
            assert value == n + 1
        else:
            assert value == [0]
    # every submit went out in one pipeline, FIN/REQ/TOUCH merged per channel and shape
    assert len(recorder.batches) == 1
    assert sorted(recorder.batches[0]) == ["finish", "publish", "requeue", "touch"]

    state = s.reads.read_channel("t", "c")
    assert state["depth"] == n // 4 + 1          # the requeued ones and the new message
    assert state["in_flight_count"] == n // 2    # touched and wrongly finished
    assert state["requeue_count"] == n // 4


def test_each_submit_gets_its_own_result_and_errors(fake_store, commit):
    s = fake_store
    s.subscribe("t", "c", "b1")
    s.redis.set(ChannelKeys.of("t", "broken").queue, b"not a list")
    s.publish("t", [b"x"])
    good = commit.submit(s.deliver_op("t", "c", [("a", 1_000, 1)]))
    bad = commit.submit(s.deliver_op("t", "broken", [("a", 1_000, 1)]))
    other = commit.submit(s.publish_op("u", [b"y"]))
    (records,) = good.get(timeout=5)
    assert parse_record(records[0])[3] == b"x"
    with pytest.raises(StoreError, match="^WRONGTYPE Operation against a key holding the wrong "
                                         "kind of value$"):
        bad.get(timeout=5)
    assert other.get(timeout=5) == 1


def test_batches_are_bounded(fake_store):
    s = fake_store
    commit = GroupCommit(s, max_batch=4)
    try:
        recorder = Recorder(s)
        results = [commit.submit(s.publish_op(f"t{i}", [b"x"])) for i in range(10)]
        assert [r.get(timeout=5) for r in results] == [1] * 10
        assert [len(b) for b in recorder.batches] == [4, 4, 2]
    finally:
        commit.stop()


def test_later_submits_form_the_next_batch(fake_store, commit):
    s = fake_store
    recorder = Recorder(s)
    assert commit.call(s.publish_op("t", [b"1"])) == 1
    assert commit.call(s.publish_op("t", [b"2"])) == 2
    assert len(recorder.batches) == 2


def test_unreachable_redis_fails_every_submit(fake_store):
    store = fake_store
    store.runner.load_library()

    def refused(ops):
        raise redis.exceptions.ConnectionError("Connection refused")
    store.runner._execute = refused
    commit = GroupCommit(store)
    try:
        results = [commit.submit(store.publish_op("t", [b"x"])),
                   commit.submit(store.finish_op("t", "c", [("a", "1")])),
                   commit.submit(store.finish_op("t", "c", [("b", "2")]))]
        for r in results:
            with pytest.raises(StoreConnectionError):
                r.get(timeout=5)
        # the loop survives: later submits are answered too
        with pytest.raises(StoreConnectionError):
            commit.call(store.publish_op("t", [b"y"]))
    finally:
        commit.stop()


def test_an_op_past_its_patience_fails_and_is_never_sent(fake_store):
    """A waiter stops at the op's deadline (a broker's --redis-timeout) whatever its lane
    is busy with; an op given up on before its lane got to it never runs."""
    commit = GroupCommit(fake_store, patience=0.2)
    try:
        late = commit.submit(fake_store.publish_op("t", [b"late"]),
                             since=time.monotonic() - 0.2)
        with pytest.raises(StoreConnectionError) as failed:
            late.get()
        assert (str(failed.value), isinstance(failed.value, OutcomeUnknown)) == (
            "no answer from redis within 200ms (not sent)", False)
        assert commit.call(fake_store.publish_op("t", [b"next"])) == 1    # "late" never ran
    finally:
        commit.stop()


def slow_down(store, seconds: float) -> None:
    """Every pipeline of `store` waits `seconds` before it runs, as on a loaded Redis."""
    execute = store.runner._execute

    def slow(calls):
        gevent.sleep(seconds)
        return execute(calls)
    store.runner._execute = slow


def test_an_op_sent_and_not_answered_in_its_patience_may_have_run(fake_store):
    """Its waiter stops at the deadline, but Redis may run it (here it does, later): the
    error says so (NoAnswer), for the publish's answer to say it may have been published."""
    fake_store.runner.load_library()
    slow_down(fake_store, 0.4)
    commit = GroupCommit(fake_store, patience=0.2)
    try:
        sent = commit.submit(fake_store.publish_op("t", [b"slow"]))
        with pytest.raises(NoAnswer, match="^no answer from redis within 200ms$"):
            sent.get()
        assert wait_for(lambda: fake_store.redis.get(TopicKeys.of("t").ids) == b"1")
    finally:
        commit.stop()


def test_waiters_stop_at_their_own_deadlines_once_the_keeper_has_gone_idle(
        fake_store, monkeypatch):
    """One greenlet keeps every waiter's deadline (Deadlines), not a gevent Timeout per
    wait: waiters of different deadlines each stop at theirs, within a TICK, and so does
    one that comes after the keeper ended for want of waiters."""
    monkeypatch.setattr(Deadlines, "IDLE", 0.1)
    fake_store.runner.load_library()
    ops = [fake_store.publish_op("t", [b"x"]) for _ in range(4)]  # built before Redis slows
    slow_down(fake_store, 0.6)
    commit = GroupCommit(fake_store, patience=0.2)

    def on_time(waited: float, deadline: float) -> bool:
        """Not before the deadline, and well before the call's answer (0.6 s)."""
        return deadline - 0.01 <= waited < deadline + Deadlines.TICK + 0.1

    def stopped_after(op, since: float) -> float:
        waited = commit.submit(op, since=since)
        started = time.monotonic()
        with pytest.raises(StoreError):
            waited.get()
        return time.monotonic() - started
    try:
        waits = [gevent.spawn(stopped_after, op, time.monotonic() - back)
                 for op, back in zip(ops, (0.1, 0, 0))]
        gevent.joinall(waits, raise_error=True)
        assert [on_time(w.value, deadline) for w, deadline in zip(waits, (0.1, 0.2, 0.2))] \
            == [True] * 3, [w.value for w in waits]
        gevent.sleep(1.2)       # every call is answered; nothing waits for 0.1 s
        assert commit.deadlines._keeper is None
        last = stopped_after(ops[3], time.monotonic())
        assert on_time(last, 0.2), last
    finally:
        commit.stop()


def test_several_ops_of_which_some_were_done_may_have_published(fake_store):
    """A keyed publish over several calls (submit_all): one refused, one done is
    not a failure to tell as such."""
    fake_store.redis.set(TopicKeys.of("broken").ids, b"not a number")
    commit = GroupCommit(fake_store, patience=5.0)
    try:
        both = commit.submit_all([fake_store.publish_op("t", [b"x"]),
                                  fake_store.publish_op("broken", [b"y"])])
        with pytest.raises(OutcomeUnknown) as failed:
            both.get()
        assert str(failed.value) == \
            "value is not an integer or out of range (1 of 2 calls done)"
        alone = commit.submit_all([fake_store.publish_op("broken", [b"y"])])
        with pytest.raises(StoreError) as refused:
            alone.get()
        assert not isinstance(refused.value, OutcomeUnknown)
    finally:
        commit.stop()


def test_each_call_of_a_staged_op_has_the_patience(fake_store):
    """An MPUB staged in several calls (bodies first, then the publish) is waited for the
    patience once per call: a 5 MB MPUB on a busy Redis is not refused for its size."""
    commit = GroupCommit(fake_store, patience=0.2)
    try:
        op = fake_store.publish_op("t", [b"x"] * 20_000)
        assert op.calls == 4     # 3 stage calls of 9,997 bodies at most, and the commit
        staged = commit.submit(op, since=time.monotonic() - 0.3)    # past one call's 0.2 s
        assert staged.get() == 20_000
    finally:
        commit.stop()


def test_building_an_op_counts_against_its_patience(fake_store, monkeypatch):
    """Publishing.submit: the time building the op takes (a partition count read from a
    Redis that does not answer) is part of the client's wait."""
    commit = GroupCommit(fake_store, patience=0.2)
    publishing = Publishing(SimpleNamespace(store=fake_store, commit=commit))  # type: ignore
    build = fake_store.publish_op

    def slow_to_build(*args):
        time.sleep(0.25)
        return build(*args)
    try:
        started = time.monotonic()
        monkeypatch.setattr(fake_store, "publish_op", slow_to_build)
        with pytest.raises(StoreConnectionError):
            publishing.submit("t", [b"slow"]).get()
        assert time.monotonic() - started < 0.4   # not 0.25 s and the patience again
        monkeypatch.setattr(fake_store, "publish_op", build)
        assert publishing.submit("t", [b"quick"]).get() == 1
    finally:
        commit.stop()


def test_lanes_keep_the_order_of_each_key(fake_store):
    """Ops with the same order key share a lane, so they run in submit order."""
    commit = GroupCommit(fake_store, lanes=3)
    try:
        assert len({id(lane.store) for lane in commit.lanes}) == 3
        results = {key: [commit.submit(fake_store.publish_op(f"t{key}", [b"x"]), key)
                         for _ in range(30)] for key in range(6)}
        for key, pending in results.items():
            assert [r.get(timeout=5) for r in pending] == list(range(1, 31))
    finally:
        commit.stop()


def test_a_staged_publish_goes_on_a_step_a_pipeline_holding_up_only_its_own_order(fake_store):
    """Its steps share pipelines with the other connections' ops, which are answered
    meanwhile; a later publish of its own connection (order) waits for its last step,
    so that connection's messages stay in order."""
    fake_store.subscribe("t", "c", "b1")
    commit = GroupCommit(fake_store)
    recorder = Recorder(commit.lanes[0].store)
    try:
        big = commit.submit(fake_store.publish_op("t", [b"big"] * 20_000), order=1)
        mine = commit.submit(fake_store.publish_op("t", [b"mine"]), order=1)
        other = commit.submit(fake_store.publish_op("t", [b"other"]), order=2)
        assert (other.get(), big.get(), mine.get()) == (1, 20_001, 20_002)
        steps = -(-20_000 // 1000)
        assert recorder.batches == [["stage", "publish"], ["stage"], ["stage"],
                                    ["publish_commit"], *[["publish_step"]] * steps,
                                    ["publish"]]
        queued = fake_store.redis.lrange(ChannelKeys.of("t", "c").queue, 0, -1)
        assert [parse_record(r)[3] for r in (queued[0], queued[1], queued[-1])] == [
            b"other", b"big", b"mine"]
    finally:
        commit.stop()


def test_a_connections_publishes_to_a_part_keep_their_order_over_lanes(fake_store):
    """With 4 lanes, a connection's big (staged) MPUB and the PUB after it go on their
    part's lane, whatever the connection's: the PUB waits for the MPUB's last step."""
    fake_store.subscribe("t", "c", "b1")
    commit = GroupCommit(fake_store, lanes=4)
    try:
        for order in range(8):
            big = commit.submit(fake_store.publish_op("t", [b"big"] * 12_000), order=order)
            mine = commit.submit(fake_store.publish_op("t", [b"mine"]), order=order)
            assert mine.get() == big.get() + 1
    finally:
        commit.stop()


def test_an_orders_ops_stay_on_one_lane_while_any_is_unanswered(fake_store):
    """Small PUBs merge on their part's lane, MPUBs of more go on their connection's:
    pipelined one after the other on 8 connections they still run in submit order,
    and once all are answered no order is held to a lane."""
    fake_store.subscribe("t", "c", "b1")
    fake_store.publish("t", [b"first"])  # learns the channels: none of its calls is sent again
    commit = GroupCommit(fake_store, lanes=4)
    try:
        sent = {order: [] for order in range(8)}
        for i in range(6):
            for order in range(8):
                bodies = [b"%d-%d" % (order, i)] * (1 if i % 2 else 20)
                sent[order].append(commit.submit(fake_store.publish_op("t", bodies), order))
        for order, results in sent.items():
            counts = [r.get() for r in results]
            assert counts == sorted(counts), order
        assert commit._on == {}
        queued = [parse_record(r)[3] for r in
                  fake_store.redis.lrange(ChannelKeys.of("t", "c").queue, 0, -1)]
        for order in range(8):
            mine = [b for b in queued if b.startswith(b"%d-" % order)]
            assert list(dict.fromkeys(mine)) == [b"%d-%d" % (order, i) for i in range(6)]
    finally:
        commit.stop()
