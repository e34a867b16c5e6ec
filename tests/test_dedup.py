"""Idempotent publish (issue 39, relay/store/dedup.py, lib/dedup.lua): the Store on
fakeredis, one Redis and the cluster, a partitioned topic among them; then real brokers
over HTTP, and relay-admin dedup and pub --id as subprocesses."""

import json
import threading
import time

import pytest

from relay.store import keys
from relay.store.data_path import KEYED_BODIES
from relay.store.dedup import key_part, key_problem
from relay.store.keys import part_name
from tests.helpers.admin import relay_admin
from tests.helpers.api import Api
from tests.helpers.store import bodies, queue, wait_past, now_ms


def topic_bodies(store, topic="t", channel="c") -> list:
    return [b for part in store.parts(topic) for b in bodies(queue(store, part, channel))]


# -- the Store -------------------------------------------------------------------------


def test_a_key_seen_within_the_window_publishes_nothing_again(store):
    store.subscribe("t", "c", "b1")
    store.set_dedup("t", 60_000)
    assert store.publish_keyed("t", [b"one"], [b"k1"]) == 0
    assert store.publish_keyed("t", [b"one again"], [b"k1"]) == 1
    assert store.publish_keyed("t", [b"two", b"one", b"three"], [b"k2", b"k1", b"k3"]) == 1
    assert topic_bodies(store) == [b"one", b"two", b"three"]
    assert store.read_topic("t")["message_count"] == 3


def test_a_key_repeated_in_one_mpub_publishes_once(store):
    store.subscribe("t", "c", "b1")
    store.set_dedup("t", 60_000)
    assert store.publish_keyed("t", [b"a", b"b", b"a2"], [b"x", b"y", b"x"]) == 1
    assert topic_bodies(store) == [b"a", b"b"]


def test_with_the_window_off_keys_change_nothing(store):
    store.subscribe("t", "c", "b1")
    assert store.dedup_window("t") == 0
    assert store.publish_keyed("t", [b"a", b"a"], [b"k", b"k"]) == 0
    assert topic_bodies(store) == [b"a", b"a"]
    assert store.redis.exists(keys.dedup_key("t")) == 0
    store.set_dedup("t", 60_000)
    store.set_dedup("t", 0)
    assert store.publish_keyed("t", [b"a"], [b"k"]) == 0
    assert len(topic_bodies(store)) == 3


def test_a_key_is_published_again_once_its_window_passed(store):
    store.subscribe("t", "c", "b1")
    store.set_dedup("t", 50)
    assert store.publish_keyed("t", [b"a"], [b"k"]) == 0
    wait_past(store, now_ms(store) + 60)
    assert store.publish_keyed("t", [b"b"], [b"k"]) == 0
    assert topic_bodies(store) == [b"a", b"b"]


def test_memory_is_bounded_by_the_window(store):
    """Expired keys are swept by later publishes, and the whole set expires a window
    after its last write."""
    store.set_dedup("t", 100)
    store.publish_keyed("t", [b"m"] * 50, [b"old%d" % i for i in range(50)])
    wait_past(store, now_ms(store) + 110)
    store.publish_keyed("t", [b"m"], [b"new"])
    assert store.redis.zrange(keys.dedup_key("t"), 0, -1) == [b"new"]
    assert 0 < store.redis.pttl(keys.dedup_key("t")) <= 100


def test_a_deferred_keyed_publish_is_deduplicated_too(store):
    store.subscribe("t", "c", "b1")
    store.set_dedup("t", 60_000)
    assert store.publish_keyed("t", [b"a"], [b"k"], defer_ms=60_000) == 0
    assert store.publish_keyed("t", [b"a"], [b"k"], defer_ms=60_000) == 1
    assert store.read_channel("t", "c")["deferred_count"] == 1


def test_a_key_always_goes_to_the_part_its_hash_picks(store):
    store.set_partitions("t", 3)
    store.subscribe("t", "c", "b1")
    store.set_dedup("t", 60_000)
    assert [store.redis.hget(keys.TopicKeys.of(p).meta, "dedup_ms") for p in store.parts("t")] \
        == [b"60000"] * 3
    ids = [b"key-%d" % i for i in range(30)]
    assert store.publish_keyed("t", [b"m-" + k for k in ids], ids) == 0
    assert store.publish_keyed("t", [b"again"] * 30, ids) == 30
    for index, part in enumerate(store.parts("t")):
        expected = [b"m-" + k for k in ids if key_part(k, 3) == index]
        assert bodies(queue(store, part, "c")) == expected
        assert sorted(store.redis.zrange(keys.dedup_key(part), 0, -1)) == \
            sorted(k for k in ids if key_part(k, 3) == index)
    assert {p["keys"] for p in store.dedup_report("t")["partitions"]} <= set(range(31))
    assert sum(p["keys"] for p in store.dedup_report("t")["partitions"]) == 30


def test_new_parts_get_the_window(store):
    store.set_dedup("t", 5000)
    store.set_partitions("t", 2)
    assert store.redis.hget(keys.TopicKeys.of(part_name("t", 1)).meta, "dedup_ms") == b"5000"


def test_a_keyed_mpub_past_one_call_is_split_and_deduplicated_whole(store):
    store.subscribe("t", "c", "b1")
    store.set_dedup("t", 60_000)
    n = KEYED_BODIES * 2 + 10
    ids = [b"%d" % i for i in range(n)]
    assert len(store.keyed_publish_ops("t", [b"x"] * n, ids)) == 3
    assert store.publish_keyed("t", [b"x"] * n, ids) == 0
    assert store.publish_keyed("t", [b"x"] * n, ids) == n
    assert store.read_channel("t", "c")["depth"] == n


def test_racing_publishers_of_one_key_publish_it_once(store):
    store.subscribe("t", "c", "b1")
    store.set_dedup("t", 60_000)
    duplicates = []

    def publish(n):
        duplicates.append(store.publish_keyed("t", [b"body %d" % n], [b"the-key"]))
    threads = [threading.Thread(target=publish, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(duplicates) == [0] + [1] * 7
    assert len(topic_bodies(store)) == 1


@pytest.mark.parametrize("key, problem", [
    (b"", "ID_EMPTY"), (b"k" * 257, "ID_TOO_LONG"), (b"\xff\xfe", "ID_NOT_TEXT"),
    (b"a b", "ID_NOT_TEXT"), (b"a\nb", "ID_NOT_TEXT"), (b"tab\t", "ID_NOT_TEXT"),
    (b"k" * 256, None), ("cl\u00e9-\u2603".encode(), None), (b"q:1:0:7", None)])
def test_key_limits(key, problem):
    assert key_problem(key) == problem
