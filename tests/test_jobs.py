"""Long admin operations: drop.lua's cut, freeing trash in chunks, admin requeue, and
the rq jobs that run them (rq's SimpleWorker in burst mode, on both backends)."""

import time

import fakeredis

from relay.codec import parse_record
from relay.store import stats
from relay.store import Store
from relay.store.keys import ChannelKeys, TopicKeys
from workers import operations
from tests.helpers.jobs import Producer, fill, work
from tests.helpers.servers import all_keys


def queued_bodies(store, topic, channel):
    return [parse_record(r)[3] for r in store.redis.lrange(ChannelKeys.of(topic, channel).queue,
                                                           0, -1)]


def test_drop_detaches_into_trash_and_frees_it_in_chunks(store):
    store.subscribe("t", "c", "b1")
    store.publish("t", [b"a", b"b", b"c"])
    store.publish("t", [b"later"], defer_ms=60000)
    store.deliver("t", "c", [("b1:1", 60000, 1)])

    dropped = store.control.detach("t", "c")
    assert dropped.last_id == 4
    assert [k.rsplit(":", 1)[1] for k in dropped.trash] == ["1", "2", "3", "4"]
    assert all(k.startswith("relay:{t}:trash:") for k in dropped.trash)
    assert operations.trash_sizes(store, dropped.trash) == [(b"list", 2), (b"zset", 1),
                                                            (b"zset", 1), (b"hash", 2)]
    c = store.reads.read_channel("t", "c")
    assert (c["depth"], c["in_flight_count"], c["deferred_count"], c["message_count"]) == (
        0, 0, 0, 4)
    assert store.redis.zscore(TopicKeys.of("t").due, "c") is None
    store.publish("t", [b"after"])
    assert queued_bodies(store, "t", "c") == [b"after"]

    assert [sum(operations.free_trash(store, k, 1)) for k in dropped.trash] == [2, 1, 1, 2]
    assert all_keys(store.redis, "relay:{t}:trash:*") == []


def test_free_trash_chunks(store):
    store.redis.rpush("relay:{t}:trash:x:1", *range(2500))
    store.redis.zadd("relay:{t}:trash:x:2", {str(i): i for i in range(2500)})
    store.redis.hset("relay:{t}:trash:x:3", mapping={str(i): i for i in range(2500)})
    assert list(operations.free_trash(store, "relay:{t}:trash:x:1", 1000)) == [1000, 1000, 500]
    assert list(operations.free_trash(store, "relay:{t}:trash:x:2", 1000)) == [1000, 1000, 500]
    chunks = list(operations.free_trash(store, "relay:{t}:trash:x:3", 1000))
    assert sum(chunks) == 2500 and len(chunks) >= 2
    assert all_keys(store.redis, "*") == []


def test_drop_deletes_channel_and_topic(store):
    store.subscribe("t", "c", "b1")
    store.subscribe("t", "d", "b1")
    store.publish("t", [b"a"])
    assert store.control.detach("t", "nope", delete=True) is None
    channel = store.control.detach("t", "c", delete=True)
    assert store.reads.channel_names("t") == ["d"]
    assert operations.trash_sizes(store, channel.trash) == [(b"list", 1)]
    assert all_keys(store.redis, "relay:{t}:ch:c:*") == []
    topic = store.control.detach("t", delete=True)
    assert operations.trash_sizes(store, topic.trash) == [(b"list", 1)]
    assert store.reads.topic_names() == []
    assert store.control.detach("t", delete=True) is None
    assert sorted(all_keys(store.redis, "relay:{t}:*")) == sorted(
        [b"relay:{t}:ids", b"relay:{t}:version", channel.trash[0].encode(),
         topic.trash[0].encode()])  # ids and channel incarnations outlive the topic


def test_requeue_in_flight_takes_messages_from_any_holder(store):
    store.subscribe("t", "c", "b1")
    store.publish("t", [b"a", b"b", b"c"])
    store.deliver("t", "c", [("b1:1", 60000, 2), ("b2:7", 60000, 1)])
    assert store.control.requeue_in_flight("t", "c", [b"0000000000000001", b"0000000000000003",
                                              b"00000000000000ff"]) == [1, 1, 0]
    assert queued_bodies(store, "t", "c") == [b"a", b"c"]
    assert store.finish("t", "c", [("b1:1", b"0000000000000001")]) == [0]
    assert store.control.requeue_in_flight("t", "c", [b"0000000000000002"] * 2) == [1, 1]
    assert store.finish("t", "c", [("b1:1", b"0000000000000002")]) == [0]
    assert queued_bodies(store, "t", "c") == [b"a", b"c", b"b"]


def test_empty_job_of_a_million_messages_keeps_what_is_published_meanwhile(store, backend):
    """The cut is exact: what the channel held when the job started goes, every message
    published after it stays, in order."""
    size = 50_000 if isinstance(backend, fakeredis.FakeRedis) else 1_000_000
    store.subscribe("t", "c", "b1")
    fill(store, "t", size)
    store.deliver("t", "c", [("b1:1", 60000, 100)])
    producer = Producer(Store(backend), "t")
    producer.start()
    while len(producer.bodies) < 100:
        time.sleep(0.001)
    job = operations.enqueue(backend, "empty", "t", "c")
    work(backend)
    time.sleep(0.05)
    producer.stop()

    job.refresh()
    result = job.return_value()
    cut = int(result["cut_id"], 16)
    before = sum(1 for i in producer.bodies if i <= cut)
    after = [body for i, body in sorted(producer.bodies.items()) if i > cut]
    assert before >= 100 and after
    during = [t for t in producer.times
              if job.started_at.timestamp() <= t <= job.ended_at.timestamp()]
    # fakeredis runs every command under one in-process lock: whether a publish lands
    # inside its short job is up to thread scheduling, so only a real server shows it
    assert (during or isinstance(backend, fakeredis.FakeRedis)) and producer.slowest < 1.0
    assert queued_bodies(store, "t", "c") == after
    c = store.reads.read_channel("t", "c")
    assert (c["in_flight_count"], c["message_count"]) == (0, size + len(producer.bodies))
    total = (size + before) + 100  # queue and in flight, plus the msgs of those in flight
    assert result == {"operation": "empty", "target": "t/c", "cut_id": f"{cut:016x}",
                      "messages": size + before, "done": total, "total": total}
    assert job.get_meta()["progress"] == result
    assert all_keys(store.redis, "relay:{t}:trash:*") == []


def test_empty_cut_is_the_first_step(store):
    store.subscribe("t", "c", "b1")
    fill(store, "t", 2500)
    store.deliver("t", "c", [("b1:1", 60000, 10)])
    steps = operations.empty(store, "t", "c")
    progress = next(steps)
    assert progress == {"cut_id": f"{2500:016x}", "done": 0, "total": 2490 + 10 * 2,
                        "messages": 2500}
    store.publish("t", [b"new1", b"new2"])
    assert [p["done"] for p in steps] == [1000, 2000, 2490, 2500, 2510]
    assert queued_bodies(store, "t", "c") == [b"new1", b"new2"]


def test_requeue_all_leaves_later_deliveries_alone(store):
    store.subscribe("t", "c", "b1")
    fill(store, "t", 2600)
    store.deliver("t", "c", [("b1:1", 60000, 1200), ("b2:1", 60000, 1200)])
    time.sleep(0.002)
    steps = operations.requeue_all(store, "t", "c")
    progress = next(steps)
    assert (progress["done"], progress["total"], progress["requeued"]) == (0, 2400, 0)
    time.sleep(0.002)
    [later] = store.deliver("t", "c", [("b3:1", 60000, 200)])
    for progress in steps:
        pass
    assert (progress["done"], progress["total"], progress["requeued"]) == (2400, 2400, 2400)
    assert sorted(m["owner"] for m in stats.in_flight(store, "t", "c", 1000)) == ["b3:1"] * 200
    c = store.reads.read_channel("t", "c")
    assert (c["depth"], c["in_flight_count"], c["requeue_count"]) == (2400, 200, 2400)
    assert store.finish("t", "c", [("b1:1", b"0000000000000001")]) == [0]


def test_requeue_and_delete_jobs_report_progress_in_meta(store, backend):
    store.subscribe("t", "c", "b1")
    store.subscribe("t", "d", "b1")
    fill(store, "t", 3000)
    store.deliver("t", "c", [("b1:1", 60000, 2500)])
    requeue = operations.enqueue(backend, "requeue", "t", "c")
    delete = operations.enqueue(backend, "delete", "t", "")
    work(backend)
    assert requeue.return_value() == {"operation": "requeue", "target": "t/c", "done": 2500,
                                      "total": 2500, "requeued": 2500,
                                      "cut_ms": requeue.return_value()["cut_ms"]}
    assert requeue.get_meta() == {"operation": "requeue", "target": "t/c",
                                  "progress": requeue.return_value()}
    assert delete.return_value()["messages"] == 6000
    assert store.reads.topic_names() == []
    assert [k for k in all_keys(store.redis, "relay:*")
            if not k.endswith((b":ids", b":version", b":news"))] == []  # they outlive the topic
