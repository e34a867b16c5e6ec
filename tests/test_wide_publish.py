"""A publish to a topic part of many channels (issue 57, item 4): each message made
visible a slice of WIDE_CHANNELS channels per call (lib/wide.lua), so that no call holds
Redis for all of them; whoever goes on with it (its broker, or a scanner after it died)
gives each channel each message once. Here the slice is 3 channels."""

import pytest

from relay.store import Store, data_path
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.limits import Limit
from relay.store.replies import Stepped
from tests.helpers.servers import all_keys
from tests.helpers.store import bodies, ids, mid, queue, subscribed
from tests.test_staged_publish import nothing_left
from workers.scanner import SWEEP_STEP, Scanner

SLICE = 3
CHANNELS = [f"c{i:02d}" for i in range(10)]


@pytest.fixture
def wide(store, monkeypatch):
    """A Store that finds topic "t" with 10 channels, more than a slice, when it reads
    the topic's partitions (as a broker does about once a second)."""
    monkeypatch.setattr(data_path, "WIDE_CHANNELS", SLICE)
    for channel in CHANNELS:
        subscribed(store, "t", channel)
    return Store(store.redis)


def calls_of(store):
    """The calls a Store sends, as lists of ops, one per pipeline."""
    executed = []
    real_execute = store.runner._execute
    store.runner._execute = lambda ops: executed.append(list(ops)) or real_execute(ops)
    return executed


def started(store, body_list, defer_ms=0):
    """A wide publish committed, its broker gone before any step: (token, first slice)."""
    op = store.publish_op("t", body_list, defer_ms)
    while op.script != "publish_step":
        (goes_on,) = store.run_many([op], follow=False)
        op = goes_on.op
    return op.args[-2], list(op.args[1:1 + int(op.args[0])])


def test_one_message_to_many_channels_goes_a_slice_a_call(wide):
    """One message to 10 channels: a stage, a commit that names no channel, then 4
    steps naming 3, 3, 3 and 1; each channel gets it once and counts it, the topic
    counts it once, and nothing of the publish is left."""
    executed = calls_of(wide)
    assert wide.publish("t", [b"hello"]) == 1
    scripts = [op.script for ops in executed for op in ops]
    assert scripts == ["partitions", "stage", "publish_commit"] + ["publish_step"] * 4
    named = [int(op.args[0]) for ops in executed for op in ops if op.script.startswith("pub")]
    assert named == [0, 3, 3, 3, 1]
    for channel in CHANNELS:
        assert bodies(queue(wide, "t", channel)) == [b"hello"]
        assert wide.reads.read_channel("t", channel)["message_count"] == 1
    assert int(wide.redis.hget(TopicKeys.of("t").meta, "message_count")) == 1
    assert nothing_left(wide)


def test_an_mpub_goes_message_by_message_each_to_every_channel_deferred_too(wide):
    assert wide.publish("t", [b"a", b"b", b"c"]) == 3
    assert wide.publish("t", [b"d", b"e"], defer_ms=60_000) == 5
    for channel in CHANNELS:
        assert ids(queue(wide, "t", channel)) == [mid(1), mid(2), mid(3)]
        c = ChannelKeys.of("t", channel)
        assert wide.redis.zrange(c.deferred, 0, -1) == [mid(4), mid(5)]
        assert bodies(wide.redis.hmget(c.msgs, [mid(4), mid(5)])) == [b"d", b"e"]
    assert nothing_left(wide)


def test_a_step_given_another_slice_does_nothing_but_name_the_right_one(wide):
    """Two processes going on with one publish: a step sent with a slice that is done
    already (the other did it) publishes nothing again."""
    token, first = started(wide, [b"x", b"y"])
    broker, scanner = wide, wide.sibling()
    done = broker.run(broker.publish_step_op("t", token, first))
    assert done.published == 0 and done.left == 2 and len(done.channels) == SLICE
    again = scanner.run(scanner.publish_step_op("t", token, first))
    assert again.published == 0 and again.left == 2 and len(again.channels) == SLICE
    assert not set(again.channels) & set(first)
    while (done := broker.run(broker.publish_step_op("t", token, done.channels))).more:
        pass
    assert scanner.run(scanner.publish_step_op("t", token, first)) == Stepped(0, 0)
    for channel in CHANNELS:
        assert ids(queue(wide, "t", channel)) == [mid(1), mid(2)]
    assert nothing_left(wide)


def test_a_channel_deleted_mid_message_is_skipped_one_made_gets_the_next_message(wide):
    token, first = started(wide, [b"x", b"y"])
    gone = next(c for c in CHANNELS if c not in first)
    wide.control.delete_channel("t", gone)
    subscribed(wide, "t", "late")
    stepped = Stepped(0, 2, first)
    while stepped.more:
        stepped = wide.run(wide.publish_step_op("t", token, stepped.channels))
    assert wide.redis.exists(*ChannelKeys.of("t", gone).all()) == 0
    assert ids(queue(wide, "t", "late")) == [mid(2)]
    for channel in CHANNELS:
        if channel != gone:
            assert ids(queue(wide, "t", channel)) == [mid(1), mid(2)]
    assert nothing_left(wide)


def test_the_history_keeps_each_message_once(wide):
    wide.history.set_retention("t", 3_600_000, 0)
    wide.publish("t", [b"a", b"b"])
    assert [ids(chunk) for chunk in wide.history.history_records("t")] == [[mid(1), mid(2)]]


@pytest.mark.parametrize("rule", ["paused", "limited", "ordered"])
def test_a_topic_with_limited_or_ordered_channels_or_paused_publishes_all_at_once(wide, rule):
    """The slices would break a reject limit's all or nothing, an ordered gate's admits
    and a pause's backlog: such a topic's publish names every channel per call."""
    if rule == "paused":
        wide.control.pause_topic("t", True)
    elif rule == "limited":
        wide.limits.set_limit("t", CHANNELS[0], Limit(100, "reject"))
    else:
        wide.ordering.set_ordered("t", CHANNELS[0], True)
    executed = calls_of(wide)
    wide.publish("t", [b"m"])
    steps = [int(op.args[0]) for ops in executed for op in ops if op.script == "publish_step"]
    assert steps and all(n == len(CHANNELS) for n in steps)
    if rule == "paused":
        assert bodies(wide.redis.lrange(TopicKeys.of("t").backlog, 0, -1)) == [b"m"]
    else:
        for channel in CHANNELS:
            assert bodies(queue(wide, "t", channel)) == [b"m"]
    assert nothing_left(wide)


def test_the_scanners_sweep_finishes_a_wide_publish_its_broker_left_half_done(wide, monkeypatch):
    token, first = started(wide, [b"x", b"y", b"z"])
    stepped = wide.run(wide.publish_step_op("t", token, first))
    wide.run(wide.publish_step_op("t", token, stepped.channels))
    monkeypatch.setattr(data_path, "STALLED_MS", 0)
    clock = [0.0]
    scanner = Scanner(wide.sibling(), clock=lambda: clock[0])
    scanner.scan_once()
    clock[0] += SWEEP_STEP
    scanner.scan_once()
    for channel in CHANNELS:
        assert ids(queue(wide, "t", channel)) == [mid(1), mid(2), mid(3)]
    assert nothing_left(wide)
    assert all_keys(wide.redis, "relay:{t}:staging:*") == []
