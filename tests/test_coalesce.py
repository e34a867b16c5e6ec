"""Publish coalescing (issue 47 item 1): the one-message publishes of many clients to a
topic part merged into one publish.lua call, each answered as its own call would be,
in the Store on fakeredis, Redis and a cluster, and in the group commit."""

import http.client
from concurrent.futures import ThreadPoolExecutor

import gevent
import pytest
from redis.cluster import RedisCluster
from prometheus_client.parser import text_string_to_metric_families

from relay.codec import FRAME_ERROR, FRAME_RESPONSE, parse_record
from relay.errors import StoreError
from relay.store import Store
from relay.store.batchers import answers
from relay.store.commit import GroupCommit
from relay.store.connection import connect, is_cluster
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.limits import Limit
from tests.helpers.api import Api
from tests.helpers.wire import Wire, size

FULL = "channel t/c is full (max depth 3)"


@pytest.fixture
def store(backend):
    return Store(backend)


def merged_run(store, ops):
    """The ops merged as a broker's group commit merges them, run: each op's answer,
    and the number of script calls made."""
    calls = store.runner.batchers.calls(ops)
    return answers(calls, store.run_many([call.op for call in calls]), len(ops)), len(calls)


def queued(store, topic="t", channel="c"):
    return [parse_record(r)[3]
            for r in store.redis.lrange(ChannelKeys.of(topic, channel).queue, 0, -1)]


def test_merged_publishes_are_one_call_and_each_gets_the_count_of_its_last(store):
    store.subscribe("t", "c", "b1")
    store.publish("t", [b"before"])
    ops = [store.publish_op("t", [b"a"]), store.publish_op("t", [b"b", b"c"]),
           store.publish_op("t", [b"d"])]
    assert merged_run(store, ops) == ([2, 4, 5], 1)
    assert queued(store) == [b"before", b"a", b"b", b"c", b"d"]
    assert [parse_record(r)[2] for r in store.redis.lrange(
        ChannelKeys.of("t", "c").queue, 0, -1)][1:] == [b"%016x" % n for n in (2, 3, 4, 5)]
    assert store.reads.read_channel("t", "c")["message_count"] == 5


def test_publishes_merge_per_topic_delay_and_keyedness(store):
    """Deferred ones merge only with those of the same delay; keyed only with keyed."""
    store.subscribe("t", "c", "b1")
    store.dedup.set_dedup("t", 60_000)
    ops = [store.publish_op("t", [b"now"]), store.publish_op("u", [b"other topic"]),
           store.publish_op("t", [b"later"], defer_ms=60_000),
           store.publish_op("t", [b"now too"]),
           store.publish_op("t", [b"later too"], defer_ms=60_000),
           store.publish_op("t", [b"later still"], defer_ms=90_000),
           store.publish_op("t", [b"keyed"], publish_keys=[b"k1"])]
    answers, calls = merged_run(store, ops)
    assert (answers, calls) == ([1, 1, 3, 2, 4, 5, 0], 5)
    assert queued(store) == [b"now", b"now too", b"keyed"]
    assert store.reads.read_channel("t", "c")["deferred_count"] == 3


def test_keyed_publishes_merged_count_their_own_duplicates(store):
    """A key an earlier publish of the same call has is a duplicate, as it would be
    in a call of its own after that one."""
    store.subscribe("t", "c", "b1")
    store.dedup.set_dedup("t", 60_000)
    assert store.dedup.publish_keyed("t", [b"old"], [b"k0"]) == 0
    ops = [store.publish_op("t", [b"1"], publish_keys=[b"k1"], index=0),
           store.publish_op("t", [b"1 again", b"2"], publish_keys=[b"k1", b"k2"], index=0),
           store.publish_op("t", [b"old again"], publish_keys=[b"k0"], index=0),
           store.publish_op("t", [b"3", b"3 again"], publish_keys=[b"k3", b"k3"], index=0)]
    assert merged_run(store, ops) == ([0, 1, 1, 1], 1)
    assert queued(store) == [b"old", b"1", b"2", b"3"]


def test_a_full_channel_refuses_only_the_publishes_it_has_no_room_for(store):
    """Each publish is admitted, in order, if the reject channel has room for all of it
    after those before it: the refused one gets the refusal, the others are published."""
    for channel in ("c", "d"):
        store.subscribe("t", channel, "b1")
    store.limits.set_limit("t", "c", Limit(3, "reject"))
    ops = [store.publish_op("t", [b"1", b"2"]), store.publish_op("t", [b"3", b"4"]),
           store.publish_op("t", [b"5"]), store.publish_op("t", [b"6"])]
    answers, calls = merged_run(store, ops)
    assert calls == 1
    assert [str(a) if isinstance(a, StoreError) else a for a in answers] == [2, FULL, 3, FULL]
    assert queued(store) == queued(store, channel="d") == [b"1", b"2", b"5"]
    assert int(store.redis.get(TopicKeys.of("t").ids)) == 3


def test_a_refused_publish_leaves_its_keys_for_a_later_one(store):
    store.subscribe("t", "c", "b1")
    store.dedup.set_dedup("t", 60_000)
    store.limits.set_limit("t", "c", Limit(3, "reject"))
    ops = [store.publish_op("t", [b"a", b"b", b"c", b"d"], index=0,
                            publish_keys=[b"ka", b"kb", b"kc", b"kd"]),
           store.publish_op("t", [b"a"], index=0, publish_keys=[b"ka"])]
    answers, _ = merged_run(store, ops)
    assert [str(a) if isinstance(a, StoreError) else a for a in answers] == [FULL, 0]
    assert queued(store) == [b"a"]
    assert store.dedup.publish_keyed("t", [b"a"], [b"ka"]) == 1


def test_merged_publishes_are_retained_each(store):
    """With retention on, the history keeps every message of a merged call, in order."""
    store.subscribe("t", "c", "b1")
    store.history.set_retention("t", 60_000, 0)
    ops = [store.publish_op("t", [b"a"]), store.publish_op("t", [b"b", b"c"])]
    assert merged_run(store, ops) == ([1, 3], 1)
    assert [parse_record(r)[3] for chunk in store.history.history_records("t")
            for r in chunk] == [b"a", b"b", b"c"]


def test_publishes_to_a_partitioned_topic_merge_per_part(store):
    """Each publish goes to the next part in turn: one call per part, each publish
    answered its part's count."""
    store.subscribe("t", "c", "b1")
    store.control.set_partitions("t", 3)
    store.subscribe("t", "c", "b1")
    ops = [store.publish_op("t", [b"%d" % i]) for i in range(9)]
    answers, calls = merged_run(store, ops)
    assert calls == 3
    assert sorted(answers) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert sorted(parse_record(r)[3] for part in store.parts("t") for r in store.redis.lrange(
        ChannelKeys.of(part, "c").queue, 0, -1)) == [b"%d" % i for i in range(9)]


def test_a_merged_call_with_a_stale_channel_list_is_sent_again(backend):
    """Built by a broker that has not seen the topic's new channel: the call is sent
    again with the real channels, and every publish reaches it."""
    publisher, other = Store(backend), Store(backend)
    ops = [publisher.publish_op("t", [b"x"]), publisher.publish_op("t", [b"y"])]
    other.subscribe("t", "c", "b1")
    assert merged_run(publisher, ops) == ([1, 2], 1)
    assert queued(publisher) == [b"x", b"y"]


def function_calls(client) -> int:
    """The function calls Redis (each master of a cluster) has run."""
    if is_cluster(client):
        nodes = client.info("commandstats", target_nodes=RedisCluster.PRIMARIES).values()
    else:
        nodes = [client.info("commandstats")]
    return sum(n.get("cmdstat_fcall", {}).get("calls", 0) for n in nodes)


@pytest.mark.integration
def test_a_brokers_mpubs_to_a_topic_with_a_channel_are_one_call_each(processes, redis_url):
    """What the broker's lanes learn of a topic's channels, the Store that builds its
    ops knows: after the first MPUB found its channel list stale, each is built with the
    real one and sent once (each was sent twice, stale and again, when the lanes alone
    learned it)."""
    _, port = processes.broker()
    client = connect(redis_url)
    Store(client).control.create_channel("t", "c")
    producer = Wire(port)
    assert producer.mpub("t", [b"m"] * 20) == (FRAME_RESPONSE, b"OK")
    before = function_calls(client)
    for _ in range(5):
        assert producer.mpub("t", [b"m"] * 20) == (FRAME_RESPONSE, b"OK")
    assert function_calls(client) - before == 5
    assert Store(client).reads.read_channel("t", "c")["depth"] == 120


def test_a_failed_merged_call_fails_each_publish_it_carried(store):
    store.redis.set(TopicKeys.of("broken").ids, b"not a number")
    ops = [store.publish_op("broken", [b"x"]), store.publish_op("t", [b"y"]),
           store.publish_op("broken", [b"z"])]
    answers, calls = merged_run(store, ops)
    assert calls == 2
    assert answers[1] == 1
    for i in (0, 2):
        assert isinstance(answers[i], StoreError)
        assert str(answers[i]).endswith("value is not an integer or out of range")


def test_publishes_of_many_connections_meet_on_their_part_lane_and_merge(store):
    """Submitted with different orders (connections) over 4 lanes: one pipeline, one
    publish call per topic, each answered its own count, in each connection's order."""
    store.subscribe("t", "c", "b1")
    store.subscribe("u", "c", "b1")
    commit = GroupCommit(store, lanes=4)
    try:
        calls = []
        for lane in commit.lanes:
            run_many = lane.store.run_many

            def recorded(ops, follow=True, run_many=run_many):
                calls.append([op.script for op in ops])
                return run_many(ops, follow)
            lane.store.run_many = recorded
        results = {(topic, client): [commit.submit(store.publish_op(topic, [b"%d" % i]), client)
                                     for i in range(3)]
                   for topic in ("t", "u") for client in range(8)}
        answered = {key: [r.get() for r in pending] for key, pending in results.items()}
        for topic in ("t", "u"):
            counts = [n for (t, _), got in answered.items() if t == topic for n in got]
            assert sorted(counts) == list(range(1, 25))
        assert all(got == sorted(got) for got in answered.values())
        assert sorted(map(sorted, calls)) == [["publish"], ["publish"]] \
            or sorted(map(sorted, calls)) == [["publish", "publish"]]
        assert sorted(queued(store)) == sorted(queued(store, "u")) == sorted(
            [b"0", b"1", b"2"] * 8)
    finally:
        commit.stop()


def test_a_lone_publish_goes_at_once(store):
    """Nothing waits to fill a batch: a publish on an idle lane is sent alone."""
    commit = GroupCommit(store, lanes=4)
    try:
        first = commit.submit(store.publish_op("t", [b"x"]), 1)
        assert first.get() == 1
        second = gevent.spawn(lambda: commit.call(store.publish_op("t", [b"y"]), 2))
        assert second.get(timeout=5) == 2
    finally:
        commit.stop()


# -- a broker's clients -----------------------------------------------------------

def samples(api) -> dict:
    status, body, _ = api.request("GET", "/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples}


def frames(wire, n):
    return [wire.frame() for _ in range(n)]


@pytest.mark.integration
def test_many_connections_publishing_at_once_share_calls_each_answered_in_order(
        processes, redis_url):
    """16 connections each send 12 PUBs, DPUBs and one-message MPUBs over 3 topics at
    once: every one is answered OK in order, stored once, and the publishes went in far
    fewer script calls than there were of them (/metrics). A connection's messages to a
    topic are queued in the order it sent them."""
    _, port = processes.broker()
    api = Api(port, processes.http_ports[port])
    topics = ("a", "b", "c")
    for topic in topics:
        assert api.request("POST", f"/topic/create?topic={topic}")[0] == 200
        assert api.request("POST", f"/channel/create?topic={topic}&channel=ch")[0] == 200
    wires = [Wire(port) for _ in range(16)]
    for w, wire in enumerate(wires):
        data = b""
        for i in range(12):
            topic, body = topics[i % 3].encode(), b"%d-%d" % (w, i)
            if i % 4 == 3:
                data += b"MPUB " + topic + b"\n" + size(8 + len(body)) + size(1) + size(
                    len(body)) + body
            elif i % 4 == 2:
                data += b"DPUB " + topic + b" 0\n" + size(len(body)) + body
            else:
                data += b"PUB " + topic + b"\n" + size(len(body)) + body
        wire.send(data)
    for wire in wires:
        assert frames(wire, 12) == [(FRAME_RESPONSE, b"OK")] * 12
    direct = connect(redis_url)
    for t, topic in enumerate(topics):
        bodies = [parse_record(r)[3]
                  for r in direct.lrange(ChannelKeys.of(topic, "ch").queue, 0, -1)]
        assert sorted(bodies) == sorted(b"%d-%d" % (w, i) for w in range(16)
                                        for i in range(t, 12, 3))
        for w in range(16):
            mine = [b for b in bodies if b.startswith(b"%d-" % w)]
            assert mine == [b"%d-%d" % (w, i) for i in range(t, 12, 3)]
    seen = samples(api)
    assert seen[("relay_published_messages_total", ())] == 192
    assert seen[("relay_redis_script_calls_total", (("script", "publish"),))] <= 192 / 4


@pytest.mark.integration
def test_dedup_keys_and_a_depth_limit_hold_per_publish_when_coalesced(processes, redis_url):
    """Keyed PUBs of 8 connections at once, 4 of them with one shared key, to a channel
    with room for 3: each client is told of its own publish. One that got OK has its
    message queued; a duplicate's key was published by another; a refused one
    (E_PUB_FAILED, the channel full) is nowhere; the shared key is queued once at most."""
    _, port = processes.broker()
    api = Api(port, processes.http_ports[port])
    assert api.request("POST", "/topic/create?topic=t")[0] == 200
    assert api.request("POST", "/channel/create?topic=t&channel=ch")[0] == 200
    store = Store(connect(redis_url))
    store.dedup.set_dedup("t", 60_000)
    store.limits.set_limit("t", "ch", Limit(3, "reject"))
    wires = [Wire(port) for _ in range(8)]
    for wire in wires:
        assert wire.identify(relay_dedup=True)[0] == FRAME_RESPONSE
    for w, wire in enumerate(wires):
        key = b"shared" if w < 4 else b"own-%d" % w
        wire.send(b"PUB t " + key + b"\n" + size(3) + b"m-%d" % w)
    answers = [wire.frame() for wire in wires]
    queue = [parse_record(r)[3]
             for r in store.redis.lrange(ChannelKeys.of("t", "ch").queue, 0, -1)]
    assert len(queue) == 3
    assert len([body for body in queue if int(body[2:]) < 4]) <= 1
    full = (FRAME_ERROR, b"E_PUB_FAILED PUB failed: channel t/ch is full (max depth 3)")
    for w, answer in enumerate(answers):
        body = b"m-%d" % w
        if answer == (FRAME_RESPONSE, b"OK"):
            assert body in queue
        elif answer == (FRAME_RESPONSE, b"OK DUPLICATES 1"):
            assert w < 4 and body not in queue
            assert any(int(b[2:]) < 4 for b in queue)
        else:
            assert answer == full and body not in queue
    assert answers.count((FRAME_RESPONSE, b"OK")) == 3


@pytest.mark.integration
def test_http_publishes_of_many_clients_at_once(processes, redis_url):
    """16 keep-alive HTTP clients publishing at once (/pub, and /mpub of 2): each answered
    200 OK, every message stored once."""
    _, port = processes.broker()
    api = Api(port, processes.http_ports[port])
    assert api.request("POST", "/topic/create?topic=h")[0] == 200
    assert api.request("POST", "/channel/create?topic=h&channel=ch")[0] == 200

    def client(c):
        connection = http.client.HTTPConnection("127.0.0.1", api.http_port, timeout=10)
        got = []
        for i in range(10):
            path, body = ("/pub?topic=h", b"%d-%d" % (c, i)) if i % 2 else (
                "/mpub?topic=h", b"%d-%d\n%d-%d+" % (c, i, c, i))
            connection.request("POST", path, body)
            response = connection.getresponse()
            got.append((response.status, response.read()))
        connection.close()
        return got
    with ThreadPoolExecutor(16) as pool:
        assert list(pool.map(client, range(16))) == [[(200, b"OK")] * 10] * 16
    queue = connect(redis_url).lrange(ChannelKeys.of("h", "ch").queue, 0, -1)
    assert len(queue) == 16 * 15
