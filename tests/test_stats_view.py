"""The store's /stats view (issue 49 item 5): every topic, then every channel, read in a
few pipelines, with the same figures as reading each alone, on every backend."""

import pytest

from relay.store import Store, reads, stats


@pytest.fixture
def store(backend):
    return Store(backend)


def test_every_topic_and_channel_read_in_batches_as_each_alone(store, monkeypatch):
    """Pipelines of 7 (so batches end mid-topic and mid-parts): each figure as
    read_topic and read_channel give it, topics and channels in name order."""
    monkeypatch.setattr(reads, "READ_BATCH", 7)
    for t in range(12):
        for c in range(t % 4):
            store.subscribe(f"t{t}", f"c{c}", "b1")
    store.control.set_partitions("t3", 3)
    store.subscribe("t3", "c0", "b1")
    for t in range(12):
        store.publish(f"t{t}", [b"x"] * (t + 1))
    store.deliver("t2", "c1", [("o", 60_000, 2)])
    store.publish("t5", [b"later"], defer_ms=60_000)
    topics = stats.collect(store)["topics"]
    assert [t["topic_name"] for t in topics] == sorted(f"t{t}" for t in range(12))
    for t in topics:
        name = t["topic_name"]
        alone = store.reads.read_topic(name)
        assert (t["depth"], t["message_count"], t["deferred_count"], t["partitions"]) == (
            alone["depth"], alone["message_count"], alone["deferred_count"],
            len(store.parts(name)))
        assert [c["channel_name"] for c in t["channels"]] == store.reads.channel_names(name)
        for c in t["channels"]:
            alone_channel = store.reads.read_channel(name, c["channel_name"])
            assert {k: c[k] for k in alone_channel} == alone_channel
    by_name = {t["topic_name"]: t for t in topics}
    assert [c["in_flight_count"] for c in by_name["t2"]["channels"]] == [0, 2]
    assert by_name["t3"]["partitions"] == 3
    assert by_name["t5"]["channels"][0]["deferred_count"] == 1
    assert by_name["t0"]["depth"] == 1 and by_name["t0"]["channels"] == []


def test_one_topic_or_channel_asked_for(store):
    store.subscribe("a", "x", "b1")
    store.subscribe("a", "y", "b1")
    store.subscribe("b", "x", "b1")
    assert [t["topic_name"] for t in stats.collect(store, "a")["topics"]] == ["a"]
    [only] = stats.collect(store, "a", "y")["topics"]
    assert [c["channel_name"] for c in only["channels"]] == ["y"]
    assert stats.collect(store, "nope")["topics"] == []


def test_parts_of_reads_the_unknown_topics_together(store):
    """parts() of many topics in one pipeline, each as parts() alone gives it."""
    store.control.set_partitions("p", 2)
    reader = Store(store.redis)
    calls = []
    run_many = reader.run_many
    reader.run_many = lambda ops, follow=True: calls.append(len(ops)) or run_many(ops, follow)
    assert reader.parts_of(["p", "q", "p"]) == [store.parts("p"), ["q"], store.parts("p")]
    assert calls == [3]
    assert reader.parts_of(["p", "q"]) == [store.parts("p"), ["q"]]
    assert calls == [3]     # read within PARTITIONS_TTL: taken as read
