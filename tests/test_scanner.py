"""The scanner (workers/scanner.py): Store.scan, which requeues one channel's expired
in-flight messages and promotes its due deferred ones, Store.due_channels, which finds
the channels with something due in the node due indexes, scanner passes, and the shares
that split the topics among scanners (the node indexes themselves: test_node_keys.py).
Store tests run on fakeredis, one Redis and the cluster."""

import threading
import time

import pytest
from redis.crc import key_slot

from relay.errors import StoreConnectionError, StoreError
from relay.store import Store, keys
from relay.store.connection import connect
from relay.store.inflight import member_id
from relay.store.keys import ChannelKeys, TopicKeys
from tests.helpers.processes import Processes
from tests.helpers.servers import flush
from tests.helpers.store import (attempts, bodies, due_score, empty_channel, ids, inflight_score,
                                 mid, queue, subscribed, wait_past)
from tests.helpers.wait import wait_for
from workers.scanner import SHARE_TTL_MS, Scanner, Share


# -- Store.scan: one channel ----------------------------------------------------

def test_scan_requeues_expired_in_flight_messages(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1", b"2", b"3"])
    store.deliver("t", "c", [("a", 1, 2), ("b", 60_000, 1)])
    wait_past(store, inflight_score(store, "t", "c", mid(1)))
    long_deadline = inflight_score(store, "t", "c", mid(3))
    c = ChannelKeys.of("t", "c")

    assert store.scan("t", "c") == (2, 0, long_deadline, 0)
    assert bodies(queue(store, "t", "c")) == [b"1", b"2"]
    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=2, in_flight_count=1, timeout_count=2, message_count=3, client_count=1)
    assert store.redis.hkeys(c.msgs) == [mid(3)]
    assert [member_id(m) for m in store.redis.zrange(c.inflight, 0, -1)] == [mid(3)]
    assert due_score(store, "t", "c") == long_deadline
    # the old owner lost it
    assert store.finish("t", "c", [("a", mid(1))]) == [0]
    # redelivered with attempts 2
    (got,) = store.deliver("t", "c", [("b", 60_000, 5)])
    assert (ids(got), attempts(got)) == ([mid(1), mid(2)], [2, 2])


def test_scan_with_nothing_left_removes_the_due_entry(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1"])
    store.deliver("t", "c", [("a", 1, 1)])
    assert due_score(store, "t", "c") is not None
    wait_past(store, due_score(store, "t", "c"))
    assert store.scan("t", "c") == (1, 0, -1, 0)
    assert due_score(store, "t", "c") is None
    assert store.scan("t", "c") == (0, 0, -1, 0)
    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=1, timeout_count=1, message_count=1, client_count=1)


def test_scan_before_any_deadline_sets_the_next_one(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"1"])
    store.publish("t", [b"2"], defer_ms=20_000)
    store.deliver("t", "c", [("a", 60_000, 1)])
    deferred_due = int(store.redis.zscore(ChannelKeys.of("t", "c").deferred, mid(2)))
    # a stale, too early entry is corrected to the real next deadline
    store.redis.zadd(TopicKeys.of("t").due, {"c": 1})
    assert store.scan("t", "c") == (0, 0, deferred_due, 0)
    assert due_score(store, "t", "c") == deferred_due


def test_scan_respects_its_limit(store):
    subscribed(store, "t", "c")
    store.publish("t", [b"%d" % i for i in range(5)])
    store.publish("t", [b"d%d" % i for i in range(3)], defer_ms=1)
    store.deliver("t", "c", [("a", 1, 5)])
    c = ChannelKeys.of("t", "c")
    wait_past(store, max(store.redis.zrange(z, -1, -1, withscores=True)[0][1]
                         for z in (c.inflight, c.deferred)))
    moved_out, moved_in = 0, 0
    calls = 0
    while True:
        timed_out, promoted, next_due, _ = store.scan("t", "c", 2)
        calls += 1
        assert timed_out <= 2 and promoted <= 2
        moved_out += timed_out
        moved_in += promoted
        if next_due == -1:
            break
        # still due: the entry stays in the index with a passed score
        now, due, _, _ = store.reads.due_channels()
        assert due == [("t", "c", next_due)] and next_due <= now
    assert calls == 3
    assert (moved_out, moved_in) == (5, 3)
    assert due_score(store, "t", "c") is None
    assert store.reads.read_channel("t", "c") == empty_channel(
        depth=8, timeout_count=5, message_count=8, client_count=1)


def test_scan_with_a_large_limit(store):
    """queue_scan_limit has no upper bound; 8100 expired messages in one call."""
    n = 8100
    subscribed(store, "t", "c")
    store.publish("t", [b"x"] * n)
    for _ in range(3):
        store.deliver("t", "c", [("a", 1, 2700)])
    wait_past(store, due_score(store, "t", "c") + 1)
    try:
        result = store.scan("t", "c", 10_000)
    except StoreError:
        result = None
    state = store.reads.read_channel("t", "c")
    # never both queued and in flight
    assert state["depth"] + state["in_flight_count"] == n
    assert result == (n, 0, -1, 0)


# -- Store.due_channels: the channels with something due -----------------------

def test_due_channels_lists_only_passed_entries(store):
    subscribed(store, "t", "c1")
    subscribed(store, "t", "c2")
    store.publish("t", [b"1"])
    store.deliver("t", "c1", [("a", 1, 1)])
    store.deliver("t", "c2", [("a", 60_000, 1)])
    d1 = due_score(store, "t", "c1")
    wait_past(store, d1)
    now, due, more, failed = store.reads.due_channels()
    assert due == [("t", "c1", d1)]
    assert now >= d1
    assert (more, failed) == (False, 0)


def test_one_due_read_covers_topics_in_many_slots(backend):
    """The node due indexes hold the due channels of topics in many slots: one read per
    node on a cluster, one on a single server."""
    store = Store(backend)
    topics = [f"spread{i}" for i in range(30)]
    for topic in topics:
        store.subscribe(topic, "c", "b")
        store.publish(topic, [b"x"])
        store.deliver(topic, "c", [("b:1", 1, 1)])
    time.sleep(0.01)
    groups = store.nodes.by_node(topics)
    assert len(groups) == len(store.nodes.prefixes()) == (3 if store.cluster else 1)
    assert len({key_slot(TopicKeys.of(t).due.encode()) for t in topics}) > len(groups)
    now, due, more, failed = store.reads.due_channels()
    assert sorted(t for t, c, _ in due) == sorted(topics)
    assert all(c == "c" and score <= now for _, c, score in due)
    assert (more, failed) == (False, 0)


# -- scanner passes ----------------------------------------------------------------

def _expired_channels(store, n_channels=3, per_channel=40):
    for i in range(n_channels):
        subscribed(store, "t", f"c{i}")
    store.publish("t", [b"%d" % i for i in range(per_channel)])
    for i in range(n_channels):
        store.deliver("t", f"c{i}", [("a", 1, per_channel // 2), ("b", 1, per_channel)])
    wait_past(store, store.redis.zrange(TopicKeys.of("t").due, -1, -1, withscores=True)[0][1] + 1)


def _assert_requeued_once(store, n_channels=3, per_channel=40):
    for i in range(n_channels):
        q = queue(store, "t", f"c{i}")
        assert len(q) == per_channel
        assert sorted(ids(q)) == [mid(n) for n in range(1, per_channel + 1)]
        assert store.reads.read_channel("t", f"c{i}") == empty_channel(
            depth=per_channel, timeout_count=per_channel, message_count=per_channel,
            client_count=1)
    assert store.redis.zcard(TopicKeys.of("t").due) == 0


def test_two_scanners_with_the_same_view_requeue_each_message_once(store):
    _expired_channels(store)
    s1, s2 = Scanner(type(store)(store.redis)), Scanner(type(store)(store.redis))
    # both read the due index before either scans
    view = store.reads.due_channels()
    assert len(view[1]) == 3
    s1.store.reads.due_channels = s2.store.reads.due_channels = lambda now: view
    assert s1.scan_once() is False
    assert s2.scan_once() is False
    assert (s1.timed_out, s2.timed_out) == (120, 0)
    _assert_requeued_once(store)


def test_two_scanners_in_threads_requeue_each_message_once(store):
    _expired_channels(store)
    scanners = [Scanner(type(store)(store.redis), limit=7) for _ in range(2)]
    start = threading.Barrier(2)
    errors = []

    def run(scanner):
        try:
            start.wait()
            while scanner.scan_once():
                pass
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in scanners]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert errors == []
    assert sum(s.timed_out for s in scanners) == 120
    assert sum(s.promoted for s in scanners) == 0
    _assert_requeued_once(store)


def test_scanner_passes_start_every_interval():
    """The time a pass takes is not added to the wait before the next one."""
    now, naps = [0.0], []
    scanner = Scanner(None, interval_ms=100, clock=lambda: now[0],
                      sleep=lambda s: (naps.append(s), scanner.stop()))

    def slow_pass():
        now[0] += 0.03
        return False

    scanner.scan_once = slow_pass
    scanner.run()
    assert naps == [pytest.approx(0.07)]


def test_a_seeding_that_cannot_reach_redis_fails_the_pass_without_a_warning(store, caplog):
    """The pass's outage line (run) reports an unreachable Redis once; the seeding's own
    warning came before it, in whichever order the two met the outage. A seeding Redis
    refuses otherwise is a warning, and the pass goes on."""
    subscribed(store, "t", "c")
    scanner = Scanner(type(store)(store.redis))

    def unreachable(parts):
        raise StoreConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    scanner.store.reads.seed_due = unreachable
    with pytest.raises(StoreConnectionError):
        scanner.scan_once()
    assert [r for r in caplog.records if r.levelname == "WARNING"] == []

    def refused(parts):
        raise StoreError("OOM command not allowed when used memory > 'maxmemory'.")
    scanner.store.reads.seed_due = refused
    scanner.reseed()    # as the outage did (run)
    assert scanner.scan_once() is False
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "node due indexes not seeded: OOM command not allowed when used memory "
                    "> 'maxmemory'.")]


# -- shares: scanners split the topics ---------------------------------------------

def test_scanners_split_the_slots_and_take_over_an_expired_share(backend):
    """Two live scanners cover every topic once between them; when one stops
    heartbeating, the other covers everything after SHARE_TTL_MS."""
    store = Store(backend)
    topics = [f"t{i}" for i in range(40)]
    for topic in topics:
        store.control.create_topic(topic)
    now = [1000.0]
    a = Share(store, "scanner-a", clock=lambda: now[0])
    b = Share(store, "scanner-b", clock=lambda: now[0])
    a.renew()
    b.renew()
    now[0] += 1.5
    a.renew()
    assert (a.rank, a.size, b.rank, b.size) == (0, 2, 1, 2)
    assert sorted(a.topics + b.topics) == sorted(topics)
    assert set(a.topics).isdisjoint(b.topics) and a.topics and b.topics
    assert all(key_slot(TopicKeys.of(t).due.encode()) % 2 == 0 for t in a.topics)
    now[0] += SHARE_TTL_MS / 1000 + 1   # b stopped heartbeating: its registration expires
    a.renew()
    assert (a.rank, a.size) == (0, 1)
    assert sorted(a.topics) == sorted(topics)


def test_a_scanner_requeues_only_its_share(backend):
    """Scanner passes requeue the expired messages of the topics of their share only."""
    store = Store(backend)
    for topic in ("t0", "t1", "t2", "t3"):
        store.subscribe(topic, "c", "b")
        store.publish(topic, [b"x"])
        store.deliver(topic, "c", [("b:1", 1, 1)])
    time.sleep(0.01)
    share = Share(store, "only-odd")
    share.renew()
    share.rank, share.size = 1, 2
    share.topics = [t for t in store.reads.topic_names() if share.covers(t)]
    scanner = Scanner(store, share=share)
    share._renewed = time.time()
    scanner.scan_once()
    mine = set(share.topics)
    for topic in ("t0", "t1", "t2", "t3"):
        expect = (1, 0) if topic in mine else (0, 1)
        stats = store.reads.read_channel(topic, "c")
        assert (stats["depth"], stats["in_flight_count"]) == expect, topic


@pytest.mark.integration
def test_a_scanner_killed_with_9_leaves_its_share_to_the_other(cluster_url, tmp_path):
    """Two scanner processes split the slots; one is killed with -9 before any deadline
    passes: when its registration expires, the other requeues every topic's messages."""
    flush(cluster_url)
    store = Store(connect(cluster_url))
    topics = [f"orphan{i}" for i in range(12)]
    processes = Processes(cluster_url, str(tmp_path))
    try:
        scanners = [processes.scanner() for _ in range(2)]
        assert wait_for(lambda: store.redis.zcard(keys.SCANNERS) == 2, timeout=10)
        scanners[0].kill()
        scanners[0].wait()
        for topic in topics:
            # no consumer counted: the reapers would requeue a dead broker's at once
            store.subscribe(topic, "c", "")
            store.publish(topic, [b"a", b"b"])
            store.deliver(topic, "c", [("gone:1", 1000, 2)])
        killed_at = time.monotonic()
        assert wait_for(lambda: all(store.reads.read_channel(t, "c")["depth"] == 2 for t in topics),
                        timeout=20)
        waited = time.monotonic() - killed_at
        assert [store.reads.read_channel(t, "c")["timeout_count"] for t in topics] == [2] * 12
        assert store.redis.zcard(keys.SCANNERS) == 1
        assert waited < 1 + SHARE_TTL_MS / 1000 + 3
    finally:
        processes.stop_all()
