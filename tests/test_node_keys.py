"""The node-level keys (relay/store/nodes.py, scripts/lib/node.lua): one due index and
one news hash per Redis node, written by every script that lowers a channel's due entry
or bumps a topic's news, read by scanners and brokers with one command per node; their
seeding by a scanner that starts, the scanner's sweep, and their names on a cluster. Store tests run on fakeredis, one Redis and the cluster."""

import pytest
from redis.crc import key_slot

from relay.store import Store
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.nodes import DUE, NEWS, slot_tag
from tests.helpers.store import due_score, inflight_score, mid, subscribed, wait_past
from workers import scanner as scanner_module
from workers.scanner import Scanner


def node_score(store, part, channel):
    """The channel's entry in the due index of the node serving `part`."""
    score = store.redis.zscore(store.node(part) + DUE, f"{part} {channel}")
    return None if score is None else int(score)


def node_news(store, part):
    news = store.redis.hget(store.node(part) + NEWS, part)
    return None if news is None else int(news)


def forget_node_keys(store):
    """What a restarted Redis that lost its last writes, or a lost key, leaves: no node
    keys."""
    for prefix in store.nodes.prefixes():
        store.redis.delete(prefix + DUE)
        store.redis.delete(prefix + NEWS)


def scans(scanner) -> list:
    """Record the channels each scan call of `scanner` names."""
    called, scan_op = [], scanner.store.scan_op

    def recording(topic, channel, limit):
        called.append((topic, channel))
        return scan_op(topic, channel, limit)
    scanner.store.scan_op = recording
    return called


# -- what the scripts write -------------------------------------------------------

def test_every_script_that_lowers_a_due_entry_lowers_the_nodes_with_it(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1", b"2"])
    store.deliver("t", "c", [("a", 60_000, 2)])
    deadline = inflight_score(store, "t", "c", mid(1))
    assert node_score(store, "t", "c") == due_score(store, "t", "c") == deadline
    store.requeue("t", "c", [("a", mid(1), 5_000)])       # deferred, sooner than the deadline
    assert node_score(store, "t", "c") == due_score(store, "t", "c") < deadline
    requeued = node_score(store, "t", "c")
    store.publish("t", [b"3"], defer_ms=1_000)            # a deferred publish, sooner still
    assert node_score(store, "t", "c") == due_score(store, "t", "c") < requeued
    store.deliver("t", "c", [("a", 60_000, 1)])           # later: neither index moves
    assert node_score(store, "t", "c") == due_score(store, "t", "c") < requeued

    store.publish("u", [b"x"], defer_ms=2_000)            # no channel yet: the backlog
    assert node_score(store, "u", "c") is None
    subscribed(store, "u", "c")                           # the first channel takes it
    assert node_score(store, "u", "c") == due_score(store, "u", "c") is not None

    subscribed(store, "v", "c")
    store.control.pause_topic("v", True)
    store.publish("v", [b"y"], defer_ms=3_000)            # paused: the backlog
    assert node_score(store, "v", "c") is None
    store.control.pause_topic("v", False)                         # unpaused: handed over
    assert node_score(store, "v", "c") == due_score(store, "v", "c") is not None


def test_a_channels_node_entry_follows_scan_and_deletion(store):
    subscribed(store, "t", "c")
    subscribed(store, "t", "d")
    store.publish("t", [b"1", b"2"])
    store.deliver("t", "c", [("a", 1, 1), ("b", 60_000, 1)])
    store.deliver("t", "d", [("a", 60_000, 1)])
    wait_past(store, inflight_score(store, "t", "c", mid(1)))
    long_deadline = inflight_score(store, "t", "c", mid(2))
    assert store.scan("t", "c")[:3] == (1, 0, long_deadline)
    assert node_score(store, "t", "c") == due_score(store, "t", "c") == long_deadline
    store.redis.zadd(store.node("t") + DUE, {"t c": 1})   # too early: the scan corrects it
    assert store.scan("t", "c")[:3] == (0, 0, long_deadline)
    assert node_score(store, "t", "c") == long_deadline

    store.control.empty_channel("t", "c")
    assert node_score(store, "t", "c") is None and due_score(store, "t", "c") is None
    assert node_score(store, "t", "d") is not None
    store.control.delete_channel("t", "d")
    assert node_score(store, "t", "d") is None
    store.publish("t", [b"3"], defer_ms=60_000)
    assert node_score(store, "t", "c") is not None
    store.control.delete_topic("t")
    assert node_score(store, "t", "c") is None
    assert store.redis.zcard(store.node("t") + DUE) == 0


def test_a_scan_with_nothing_left_removes_the_node_entry_even_of_a_channel_gone(store):
    """An ephemeral channel's last consumer leaving takes its entry out of the topic's
    index only: the node's, left behind, costs one scan, which removes it."""
    store.subscribe("t", "e#ephemeral", "b1")
    store.publish("t", [b"1"])
    store.deliver("t", "e#ephemeral", [("b1:1", 60_000, 1)])
    assert store.run(store.unsubscribe_op("t", "e#ephemeral", "b1", True, False, 1)) == 1
    assert due_score(store, "t", "e#ephemeral") is None
    assert node_score(store, "t", "e#ephemeral") is not None
    assert store.scan("t", "e#ephemeral") == (0, 0, -1, 0)
    assert node_score(store, "t", "e#ephemeral") is None


def test_node_news_is_the_version_a_wake_up_names(store):
    """The node news hash counts a part's news; a part's first goes on from its version
    key's count, where a stale slot map kept its news from the node hash (news.lua)."""
    subscribed(store, "t", "c")
    assert node_news(store, "t") is None
    store.publish("t", [b"1"])
    store.publish("t", [b"2"])
    assert node_news(store, "t") == 2
    assert store.redis.hget(TopicKeys.of("t").version, "news") is None
    store.redis.hset(TopicKeys.of("old").version, "news", 41)
    subscribed(store, "old", "c")
    store.publish("old", [b"1"])
    assert node_news(store, "old") == 42
    store.control.pause_channel("t", "c", True)
    store.control.pause_channel("t", "c", False)
    store.control.empty_channel("t", "c")
    assert node_news(store, "t") == 4
    assert store.reads.versions(["t"]) == {"t": 4}


def test_a_part_without_node_news_is_read_from_its_version_key_once(store):
    """A part without node news (its news counted in its version key, where a stale slot
    map kept it from the node hash): the first read takes it from the version key and
    sets the node field; the next reads need nothing else than the node hash, until
    raising the partition count (news) is read there."""
    version = TopicKeys.of("t").version
    store.redis.hset(version, mapping={"news": 5, "partitions": 3})
    scripts = []
    run_many = store.run_many
    store.run_many = lambda ops: (scripts.extend(op.script for op in ops), run_many(ops))[1]
    assert store.reads.versions(["t", "none"]) == {"t": 5, "none": 0}
    reads = ["versions"] * len(store.nodes.by_node(["t", "none"]))   # one call per node
    assert scripts == reads
    assert (node_news(store, "t"), node_news(store, "none")) == (5, 0)
    assert store.partitions("t") == 3
    store.reads.versions(["t", "none"])
    assert scripts == reads
    store.control.set_partitions("t", 4)
    scripts.clear()
    assert store.reads.versions(["t"]) == {"t": 6}
    assert scripts == ["versions"]
    assert store.partitions("t") == 4


# -- the scanner ------------------------------------------------------------------

def test_the_node_index_keeps_a_requeue_on_time_across_many_topics(backend):
    """300 topics, four with a message in flight: once their deadlines pass, one pass
    requeues those four and scans nothing else."""
    store = Store(backend)
    topics = [f"many{i}" for i in range(300)]
    for result in store.run_many([store.subscribe_op(t, "c", "") for t in topics]):
        assert result.created
    busy = topics[::75]
    for topic in busy:
        store.publish(topic, [b"x"])
        # 1.5 s: the first pass below must come before these deadlines; with 300 ms a
        # loaded machine's 4 publishes, delivers and the scanner's seeding took longer
        # (this module run beside a full test suite, [cluster])
        store.deliver(topic, "c", [("gone:1", 1500, 1)])
    scanner = Scanner(Store(backend))
    called = scans(scanner)
    assert scanner.scan_once() is False and called == []
    # a few ms more: the scanner takes Redis' clock as a little behind, never ahead
    wait_past(store, max(inflight_score(store, t, "c", mid(1)) for t in busy) + 5)
    scanner.scan_once()
    assert sorted(called) == sorted((t, "c") for t in busy)
    assert [store.reads.read_channel(t, "c")["timeout_count"] for t in busy] == [1] * 4
    called.clear()
    scanner.scan_once()
    assert called == []


def test_a_scanner_seeds_the_node_index_when_it_starts(backend):
    """Messages in flight and deferred whose node keys were lost are requeued."""
    store = Store(backend)
    topics = ["old0", "old1", "old2"]
    for topic in topics:
        subscribed(store, topic, "c", "")
        store.publish(topic, [b"in flight"])
        store.deliver(topic, "c", [("gone:1", 200, 1)])
        store.publish(topic, [b"deferred"], defer_ms=200)
        store.publish(topic, [b"later"], defer_ms=600_000)
    forget_node_keys(store)
    assert store.reads.due_channels()[1] == []
    wait_past(store, store.now_ms() + 250)
    scanner = Scanner(Store(backend))
    scanner.scan_once()
    for topic in topics:
        stats = store.reads.read_channel(topic, "c")
        assert (stats["depth"], stats["timeout_count"], stats["deferred_count"]) == (2, 1, 1)
        assert node_score(store, topic, "c") == due_score(store, topic, "c") is not None


def test_the_sweep_makes_up_for_a_lost_node_entry(backend, monkeypatch):
    """A node entry lost after the seeding (a write sent to a stale node's keys) is made
    up by the sweep, a slice each SWEEP_STEP."""
    monkeypatch.setattr(scanner_module, "SWEEP_EVERY", 3.0)
    store = Store(backend)
    topics = [f"swept{i}" for i in range(6)]
    for topic in topics:
        subscribed(store, topic, "c", "")
    clock = [0.0]
    scanner = Scanner(Store(backend), clock=lambda: clock[0])
    scanner.scan_once()                           # seeds: nothing yet
    store.publish("swept4", [b"x"])
    store.deliver("swept4", "c", [("gone:1", 1, 1)])
    store.redis.zrem(store.node("swept4") + DUE, "swept4 c")
    wait_past(store, inflight_score(store, "swept4", "c", mid(1)))
    slices = []
    for _ in range(3):
        clock[0] += scanner_module.SWEEP_STEP
        slices.append(scanner.sweep_slice())
        scanner._swept = float("-inf")            # the slice above was not seeded
    assert sorted(p for s in slices for p in s) == topics   # two a step, each once
    scanner._sweep_after = ""
    for _ in range(3):
        clock[0] += scanner_module.SWEEP_STEP
        scanner.scan_once()
    assert store.reads.read_channel("swept4", "c")["timeout_count"] == 1


def test_the_sweep_is_bounded_per_step():
    scanner = Scanner(None)
    scanner.share.topics = [f"t{i:05}" for i in range(20_000)]
    first = scanner.sweep_slice()
    assert len(first) == scanner_module.SWEEP_MOST
    assert scanner.sweep_slice()[0] > first[-1]


# -- on a cluster -----------------------------------------------------------------

def test_each_node_has_its_keys_in_a_slot_it_serves(backend):
    store = Store(backend)
    if not store.cluster:
        assert store.nodes.prefixes() == ["relay:"] == [store.node("anything")]
        return
    prefixes = store.nodes.prefixes()
    assert len(prefixes) == 3
    for topic in (f"t{i}" for i in range(50)):
        prefix = store.node(topic)
        assert prefix in prefixes
        assert (store.redis.get_node_from_key(prefix + DUE).name
                == store.redis.get_node_from_key(TopicKeys.of(topic).due).name)
    assert all(key_slot(slot_tag(s).encode()) == s for s in (0, 1, 5461, 16383))
    assert store.nodes.moved() is False and store.nodes.moved() is False


def test_an_entry_in_another_nodes_index_moves_to_its_own(backend):
    """What slots moved between masters leave: the entry goes to the index of the node
    that serves its part now, and is due from there."""
    store = Store(backend)
    if not store.cluster:
        pytest.skip("one server: one node index")
    subscribed(store, "t", "c", "")
    store.publish("t", [b"x"])
    store.deliver("t", "c", [("gone:1", 1, 1)])
    own = store.node("t")
    other = next(p for p in store.nodes.prefixes() if p != own)
    score = store.redis.zscore(own + DUE, "t c")
    store.redis.zrem(own + DUE, "t c")
    store.redis.zadd(other + DUE, {"t c": score})
    wait_past(store, int(score))
    assert store.reads.due_channels().due == []
    assert store.redis.zscore(other + DUE, "t c") is None
    assert node_score(store, "t", "c") == due_score(store, "t", "c")
    assert [(t, c) for t, c, _ in store.reads.due_channels().due] == [("t", "c")]


def test_node_keys_written_in_a_script_stay_out_of_its_keys(store):
    """A script's KEYS stay in its topic's slot: the node keys come in ARGV."""
    op = store.deliver_op("t", "c", [("a", 1000, 1)])
    assert op.args[-1] == store.node("t")
    assert {key_slot(k.encode()) for k in op.keys} == {key_slot(b"t")}
    assert ChannelKeys.of("t", "c").queue in op.keys


@pytest.fixture(autouse=True)
def _clock_every_pass(monkeypatch):
    """Scanner passes in these tests read Redis' clock every time."""
    monkeypatch.setattr(scanner_module, "CLOCK_EVERY", 0.0)
