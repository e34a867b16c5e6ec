"""MPUBs too big for one call (issue 46, item 8): staged, committed by one call, then
published in bounded steps that read their progress from Redis, so no call holds Redis
long and whoever goes on with a publish (its broker, or a scanner after it died)
publishes each message once, in order."""

import pytest

from relay.store import data_path, runner
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.replies import Stepped
from tests.helpers.servers import all_keys
from tests.helpers.store import bodies, ids, mid, queue, subscribed
from workers.scanner import SWEEP_STEP, Scanner

N = 3 * data_path.INLINE_BODIES + 7
STEP_COPIES = 1000      # publish_step.lua's


def committed(store, topic="t", bodies_=None, defer_ms=0):
    """A staged publish committed and not stepped (as if its broker died right after):
    (its last count, its token)."""
    op = store.publish_op(topic, bodies_ or sent(), defer_ms)
    while op.script != "publish_step":      # the stage calls, then the commit
        (goes_on,) = store.run_many([op], follow=False)
        op = goes_on.op
    (token,) = [t.decode() for t in store.redis.hkeys(TopicKeys.of(topic).publishing)]
    return op.job.last, token


def sent(n=N):
    return [b"%d" % i for i in range(n)]


def nothing_left(store, topic="t"):
    return (all_keys(store.redis, f"relay:{{{topic}}}:staging:*") == []
            and not store.redis.exists(TopicKeys.of(topic).publishing))


@pytest.mark.parametrize("defer_ms", [0, 60_000], ids=["now", "deferred"])
def test_an_mpub_too_big_for_one_call_is_committed_then_published_in_steps(store, defer_ms):
    """Staged by calls of at most MAX_CALL_ARGS arguments, each in a pipeline of its
    own, committed once even when the channel list it was sent with was stale (the
    commit sent again), then published in steps of STEP_COPIES messages for one
    channel; nothing is left after."""
    subscribed(store, "t", "c")
    other = store.sibling()
    other._channels = {"t": []}     # a Store that does not know channel c yet: stale
    executed = []
    real_execute = other.runner._execute
    other.runner._execute = lambda ops: executed.append(list(ops)) or real_execute(ops)
    assert other.publish("t", sent(), defer_ms=defer_ms) == N
    scripts = [op.script for ops in executed for op in ops]
    steps = -(-N // STEP_COPIES)
    stages = -(-N // (runner.MAX_CALL_ARGS - 3))
    assert scripts == (["stage"] * stages + ["publish_commit"] * 2       # stale, then again
                       + ["publish_step"] * steps)
    assert all(len(ops) == 1 for ops in executed)
    longest = max(len(op.keys) + len(op.args) for ops in executed for op in ops)
    assert longest == runner.MAX_CALL_ARGS
    c = ChannelKeys.of("t", "c")
    if defer_ms:
        assert store.redis.zcard(c.deferred) == N
        assert bodies(store.redis.hmget(c.msgs, [mid(1), mid(N)])) == [b"0", sent()[-1]]
    else:
        assert bodies(queue(store, "t", "c")) == sent()
        assert ids(queue(store, "t", "c")) == [mid(i) for i in range(1, N + 1)]
    assert store.reads.read_channel("t", "c")["message_count"] == N
    assert nothing_left(store)


def test_a_step_takes_fewer_messages_the_more_channels_it_copies_them_to(store):
    for channel in ("a", "b", "c", "d"):
        subscribed(store, "t", channel)
    last, token = committed(store)
    assert store.run(store.publish_step_op("t", token)) == Stepped(STEP_COPIES // 4,
                                                                   N - STEP_COPIES // 4)
    assert store.redis.llen(ChannelKeys.of("t", "d").queue) == STEP_COPIES // 4


def test_a_channel_made_between_steps_gets_the_rest_as_nsqd_would(store):
    subscribed(store, "t", "c")
    last, token = committed(store)
    store.run(store.publish_step_op("t", token))
    subscribed(store, "t", "late")
    while store.run(store.publish_step_op("t", token)).more:
        pass
    assert bodies(queue(store, "t", "c")) == sent()
    assert bodies(queue(store, "t", "late")) == sent()[STEP_COPIES:]
    assert nothing_left(store)


def test_two_processes_going_on_with_one_publish_publish_each_message_once(store):
    """Steps read where the publish stands from Redis: a broker that was only slow and
    a scanner that took it for dead may both step it."""
    subscribed(store, "t", "c")
    last, token = committed(store)
    broker, scanner = store, store.sibling()
    while (broker.run(broker.publish_step_op("t", token)).more
           and scanner.run(scanner.publish_step_op("t", token)).more):
        pass
    assert scanner.run(scanner.publish_step_op("t", token)) == Stepped(0, 0)
    assert ids(queue(store, "t", "c")) == [mid(i) for i in range(1, N + 1)]
    assert nothing_left(store)


def test_a_paused_topic_keeps_the_steps_in_its_backlog(store):
    store.control.pause_topic("t", True)
    assert store.publish("t", sent()) == N
    assert bodies(store.redis.lrange(TopicKeys.of("t").backlog, 0, -1)) == sent()


def test_a_channel_created_from_the_start_mid_publish_cuts_before_what_is_unpublished(store):
    """The ids a staged publish reserved but has not published yet are not in the history
    a new channel replays up to its cut: its steps publish them to the channel."""
    subscribed(store, "t", "c")
    store.history.set_retention("t", 3_600_000, 0)
    last, token = committed(store)
    store.run(store.publish_step_op("t", token))    # a copy to c, one to the history
    joined = store.run(store.subscribe_op("t", "new", ""))
    assert joined.cut == STEP_COPIES // 2


def test_the_scanners_sweep_finishes_a_publish_its_broker_left_half_done(store, monkeypatch):
    """Roll forward: the broker died after the commit and two steps; the scanner's sweep
    finds the publish not advanced for STALLED_MS and publishes the rest, each message
    once and in order."""
    subscribed(store, "t", "c")
    last, token = committed(store)
    for _ in range(2):
        store.run(store.publish_step_op("t", token))
    clock = [0.0]
    scanner = Scanner(store.sibling(), clock=lambda: clock[0])
    scanner.scan_once()                   # the node due indexes seeded
    clock[0] += SWEEP_STEP
    scanner.scan_once()                   # the sweep: advanced just now, left alone
    assert store.redis.llen(ChannelKeys.of("t", "c").queue) == 2 * STEP_COPIES
    monkeypatch.setattr(data_path, "STALLED_MS", 0)
    clock[0] += SWEEP_STEP
    scanner.scan_once()
    assert bodies(queue(store, "t", "c")) == sent()
    assert ids(queue(store, "t", "c")) == [mid(i) for i in range(1, N + 1)]
    assert store.reads.read_channel("t", "c")["message_count"] == N
    assert nothing_left(store)
