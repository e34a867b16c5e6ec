"""Partitioned topics (keys.py): the Store on fakeredis, one Redis and the cluster; then
brokers started with --topic-partitions 3 over sockets, with gnsq consumers. The dead
letters of every part are tested in test_deadletter.py."""

import itertools
import json
import random
import threading
import time
from collections import Counter

import gevent
import gnsq
import pytest
import redis

from redis.crc import key_slot

from relay import embedded
from relay.codec import parse_record
from relay.store import Store, codes, keys
from relay.store.connection import connect, is_cluster
from relay.store.control import PartitionsRefused
from relay.store.keys import ChannelKeys, TopicKeys
from relay.store.placement import placement
from tests.helpers.admin import relay_admin
from tests.helpers.servers import flush, local_cluster
from tests.helpers.gnsq_clients import addr, stop
from tests.helpers.store import bodies, channel_state, parts_of
from tests.helpers.wait import wait_for
from tests.helpers.wire import Wire


# -- the Store -------------------------------------------------------------------------


def test_publishes_go_to_the_parts_in_turn_and_ids_name_their_part(store):
    assert store.control.set_partitions("t", 3) == 1
    store.subscribe("t", "c", "b1")
    for n in range(6):
        store.publish("t", [b"m%d" % n])
    assert parts_of(store) == [2, 2, 2]
    assert store.reads.read_channel("t", "c")["depth"] == 6
    assert store.reads.read_topic("t")["message_count"] == 6
    for index in range(3):
        queued = store.redis.lrange(ChannelKeys.of(store.parts("t")[index], "c").queue, 0, -1)
        assert [parse_record(r)[2][:4] for r in queued] == [b"%04x" % index] * 2
    assert sorted(store.reads.stored_parts()) == sorted(store.parts("t"))
    assert store.reads.topic_names() == ["t"]


def test_deliver_finish_requeue_and_touch_reach_every_part(store):
    store.control.set_partitions("t", 3)
    store.subscribe("t", "c", "b1")
    for n in range(9):
        store.publish("t", [b"%02d" % n])
    [got] = store.deliver("t", "c", [("o", 60_000, 9)])
    assert sorted(bodies(got)) == [b"%02d" % n for n in range(9)]
    ids = [parse_record(r)[2] for r in got]
    assert parts_of(store, field="in_flight_count") == [3, 3, 3]
    assert all(d > 0 for d in store.touch("t", "c", [("o", i, 1000) for i in ids]))
    assert store.requeue("t", "c", [("o", ids[0], 0)]) == [1]
    assert store.finish("t", "c", [("o", i) for i in ids]) == [0] + [1] * 8
    assert store.finish("t", "c", [("x", b"0002000000000001"), ("o", b"zz")]) == [0, 0]
    assert channel_state(store, "c", "t") == (1, 0, 0)


def test_a_consumer_at_rdy_1_is_served_by_every_part(store):
    store.control.set_partitions("t", 3)
    store.subscribe("t", "c", "b1")
    for n in range(6):
        store.publish("t", [b"%d" % n], index=n % 3)
    served = [keys.id_part(parse_record(store.deliver("t", "c", [("o", 60_000, 1)])[0][0])[2])
              for _ in range(6)]
    assert sorted(served) == [0, 0, 1, 1, 2, 2]


def test_the_count_only_grows(store):
    store.control.set_partitions("t", 3)
    with pytest.raises(PartitionsRefused, match="topic t has 3 partitions: the count can "
                                                r"only grow \(asked for 2\)"):
        store.control.set_partitions("t", 2)
    assert store.control.set_partitions("t", 3) == 3
    assert store.partitions("t", fresh=True) == 3
    store.control.delete_topic("t")
    assert store.partitions("t", fresh=True) == 3     # it outlives the topic


def test_callers_that_miss_the_same_count_at_once_share_one_read(store):
    """A burst of SUBs and PUBs to a new topic reads its partition count once."""
    reads = []

    def counting(op):
        reads.append(op.keys[0])
        time.sleep(0.05)                # the others arrive while the read is out
        return store.run(op)
    store = Store(store.redis, lookup=counting)
    start = threading.Barrier(20)

    def ask():
        start.wait()
        counts.append(store.partitions("t"))
    counts = []
    threads = [threading.Thread(target=ask) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (counts, reads) == ([1] * 20, [TopicKeys.of("t").version])
    assert store.partitions("t", fresh=True) == 1 and len(reads) == 2


def test_new_parts_get_the_channels_their_settings_and_the_pause(store):
    store.subscribe("t", "c1", "b1")
    store.subscribe("t", "c2", "")
    store.control.pause_channel("t", "c2", True)
    store.control.configure_channel("t", "c1", "max_attempts", 5)
    store.control.pause_topic("t", True)
    store.publish("t", [b"old"])
    assert store.control.set_partitions("t", 3) == 1
    for part in store.parts("t")[1:]:
        assert store.reads.channel_names(part) == ["c1", "c2"]
        assert store.reads.channel_setting(part, "c1", "max_attempts") == "5"
        assert store.reads.read_channel(part, "c2")["paused"] is True
        assert store.reads.read_topic(part, parts=[part])["paused"] is True
        assert store.reads.read_channel(part, "c1")["message_count"] == 0
    store.control.pause_topic("t", False)
    store.publish("t", [b"new1"])
    store.publish("t", [b"new2"])
    assert store.reads.read_channel("t", "c1")["depth"] == 3
    assert store.reads.read_channel("t", "c2") == {**store.reads.read_channel("t", "c2"), "depth": 3,
                                             "paused": True}


def test_parts_added_while_an_unpause_goes_in_steps_start_unpaused(store):
    """A topic whose backlog goes to its channels in steps (pause_topic.lua: 50 channels
    make a step 200 records) is being unpaused: parts added meanwhile do not copy its
    pause. They did, for good: what was published to them waited until someone
    unpaused the topic again."""
    channels = [f"c{i:03}" for i in range(50)]
    for channel in channels:
        store.subscribe("t", channel, "b1")
    store.control.pause_topic("t", True)
    store.publish("t", [b"%d" % i for i in range(450)])
    assert store.run(store.pause_topic_op("t", "0")) == codes.MORE
    assert store.control.set_partitions("t", 2) == 1
    new = store.parts("t")[1]
    assert store.reads.read_topic(new, parts=[new])["paused"] is False
    store.hand_over("t")
    for n in range(4):
        store.publish("t", [b"late%d" % n])
    assert [store.reads.read_topic(part, parts=[part])["paused"]
            for part in store.parts("t")] == [False, False]
    assert [c["depth"] for c in store.reads.read_channel_parts("t", "c049")] == [452, 2]


def test_the_default_applies_to_new_topics_only(backend):
    old = Store(backend)
    old.publish("existing", [b"x"])
    store = Store(backend, topic_partitions=4)
    store.publish("existing", [b"y"])
    store.publish("fresh", [b"z"])
    store.control.create_topic("created")
    assert [store.partitions(t, fresh=True) for t in ("existing", "fresh", "created")] == \
        [1, 4, 4]
    assert Store(backend).partitions("fresh") == 4      # every process reads it


def test_empty_delete_and_in_flight_requeue_cover_every_part(store):
    store.control.set_partitions("t", 3)
    store.subscribe("t", "c", "b1")
    for n in range(6):
        store.publish("t", [b"%d" % n])
    store.deliver("t", "c", [("o", 60_000, 3)])
    dropped = store.control.drop("t", "c")
    assert {key.split("}")[0] for key in dropped.trash} == \
        {f"relay:{{{part}" for part in store.parts("t")}
    assert channel_state(store, "c", "t") == (0, 0, 0)
    for n in range(3):
        store.publish("t", [b"%d" % n])
    assert store.control.delete_topic("t") is True
    assert store.reads.topic_names() == [] and store.reads.stored_parts() == []
    assert store.redis.exists(*(ChannelKeys.of(part, "c").queue
                                for part in store.parts("t"))) == 0


def masters_of(store, topic) -> list[str]:
    """The master serving each part of the topic (host:port)."""
    return [store.nodes.address(part) for part in store.parts(topic)]


def test_parts_of_a_cluster_topic_go_to_every_master_and_work(backend):
    """100 random topics of 3 parts on 3 masters: a part on each; every process names the
    parts alike; publish, deliver and finish reach every part."""
    store = Store(backend)
    for n in range(100):
        topic = f"r{random.getrandbits(40):x}"
        store.control.set_partitions(topic, 3)
        if is_cluster(backend):
            assert len(set(masters_of(store, topic))) == 3, (topic, store.parts(topic))
        else:
            assert store.parts(topic) == [topic, f"{topic}/1", f"{topic}/2"]
        assert Store(backend).parts(topic) == store.parts(topic)
    store.subscribe(topic, "c", "b1")
    for n in range(30):
        store.publish(topic, [b"%d" % n])
    assert parts_of(store, topic) == [10, 10, 10]
    [got] = store.deliver(topic, "c", [("o", 60_000, 30)])
    assert len(got) == 30
    assert store.finish(topic, "c", [("o", parse_record(r)[2]) for r in got]) == [1] * 30


def test_every_key_of_a_placed_part_is_in_its_slot(backend):
    store = Store(backend)
    store.control.set_partitions("t", 3)
    for part in store.parts("t"):
        t, c = TopicKeys.of(part), ChannelKeys.of(part, "c")
        named = [getattr(t, f) for f in t.__dataclass_fields__ if f != "name"] + c.all()
        assert {key_slot(k.encode()) for k in named} == {keys.part_slot(part)}


def test_a_raise_keeps_the_parts_names_and_places_the_new_ones(backend):
    store = Store(backend)
    store.control.set_partitions("t", 2)
    two = store.parts("t")
    store.control.set_partitions("t", 5)
    assert store.parts("t")[:2] == two
    if is_cluster(backend):
        assert len(set(masters_of(store, "t"))) == 3
        assert masters_of(store, "t")[3:] == masters_of(store, "t")[:2]


def test_a_topic_partitioned_before_placement_keeps_its_part_names(backend):
    """Its version has a count and no placement, as written before placements were kept:
    its parts keep their plain names; a raise places only the new ones."""
    store = Store(backend)
    backend.hset(TopicKeys.of("old").version, "partitions", 3)
    assert store.parts("old", fresh=True) == ["old", "old/1", "old/2"]
    store.control.set_partitions("old", 5)
    assert store.parts("old")[:3] == ["old", "old/1", "old/2"]
    if is_cluster(backend):
        first = store.nodes.owners()[keys.part_slot("old")]
        assert [store.nodes.owners()[keys.part_slot(p)] for p in store.parts("old")[3:]] == \
            [first, (first + 1) % 3]


def test_placement_spreads_parts_over_six_masters():
    """A slot map of 6 masters (slots split evenly): 6 parts use all 6, 8 parts 6 with
    at most 2 each, part i on the master i after part 0's."""
    owners = [slot * 6 // 16384 for slot in range(16384)]
    for _ in range(100):
        topic = f"r{random.getrandbits(40):x}"
        for count in (6, 8):
            names = keys.part_names(topic, count, placement(topic, count, owners))
            on = [owners[keys.part_slot(name)] for name in names]
            assert on == [(on[0] + i) % 6 for i in range(count)]
    assert placement("t", 1, owners) == ""
    assert placement("t", 3, [0] * 16384) == ""


@pytest.fixture(scope="module")
def six_masters():
    with local_cluster([embedded.free_port() for _ in range(6)]) as url:
        yield connect(url)


def test_six_parts_on_six_masters_use_them_all(six_masters):
    store = Store(six_masters)
    for _ in range(100):
        topic = f"r{random.getrandbits(40):x}"
        store.control.set_partitions(topic, 6)
        assert len(set(masters_of(store, topic))) == 6, (topic, store.parts(topic))
    store.subscribe(topic, "c", "b1")
    store.publish(topic, [b"%d" % n for n in range(6)])
    assert sorted(parts_of(store, topic)) == [0, 0, 0, 0, 0, 6]
    [got] = store.deliver(topic, "c", [("o", 60_000, 6)])
    assert store.finish(topic, "c", [("o", parse_record(r)[2]) for r in got]) == [1] * 6


def test_a_part_whose_slot_moves_keeps_its_name_and_messages(six_masters):
    """Part 1's slot moved to part 2's master (a reshard): every process still names the
    parts alike, 5 masters serve them, and each part's message is delivered."""
    store = Store(six_masters)
    store.control.set_partitions("moved", 6)
    store.subscribe("moved", "c", "")
    for index in range(6):
        store.publish("moved", [b"%d" % index], index=index)
    names, before = store.parts("moved"), masters_of(store, "moved")
    by_address = {node.name: redis.Redis(host=node.host, port=node.port)
                  for node in six_masters.get_primaries()}
    embedded.move_slot(by_address[before[1]], by_address[before[2]],
                       keys.part_slot(names[1]),
                       others=[n for a, n in by_address.items() if a not in before[1:3]])
    again = Store(connect(f"redis://{before[0]}/0"))
    assert again.parts("moved") == names
    assert masters_of(again, "moved") == [before[0], before[2], *before[2:]]
    [got] = again.deliver("moved", "c", [("o", 60_000, 6)])
    assert sorted(bodies(got)) == [b"%d" % index for index in range(6)]


@pytest.mark.cluster
def test_relay_admin_create_puts_three_parts_on_three_masters(redis_url):
    """As a user runs it: create, then stats --partitions (--json and the table) name
    each part's master."""
    flush(redis_url)
    created = relay_admin(redis_url, "create", "ptest", "--partitions", "3")
    assert (created.returncode, created.stdout) == (0, "created ptest with 3 partitions\n")
    shown = relay_admin(redis_url, "stats", "ptest", "--partitions", "--json")
    [topic] = json.loads(shown.stdout)["topics"]
    store = Store(connect(redis_url))
    assert [p["master"] for p in topic["parts"]] == masters_of(store, "ptest")
    assert len(set(masters_of(store, "ptest"))) == (3 if is_cluster(store.redis) else 1)
    table = relay_admin(redis_url, "stats", "ptest", "--partitions").stdout.splitlines()
    assert table[0].split()[-1] == "master"
    assert [line.split()[-1] for line in table[2:5]] == masters_of(store, "ptest")


# -- brokers -----------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.cluster
def test_consumers_on_two_brokers_get_3000_messages_exactly_once(processes):
    ports = [processes.broker("--topic-partitions", "3")[1] for _ in range(2)]
    processes.scanner("--topic-partitions", "3")
    received = Counter()
    consumers = []
    for port in ports:
        consumer = gnsq.Consumer("hot", "c", [addr(port)], max_in_flight=1 if port ==
                                 ports[0] else 50)
        consumer.on_message.connect(lambda _, message: received.update([message.body]), weak=False)
        consumer.start(block=False)
        consumers.append(consumer)
    store = Store(connect(processes.redis_url))
    assert wait_for(lambda: store.reads.read_channel("hot", "c")["client_count"] == 2)
    wire = [Wire(port) for port in ports]
    sent = []
    for n in range(300):
        batch = [b"%04d-%d" % (n, i) for i in range(10)]
        assert wire[n % 2].mpub("hot", batch) == (0, b"OK")
        sent += batch
    assert wait_for(lambda: sum(received.values()) >= 3000, timeout=60)
    gevent.sleep(0.5)
    stop(*consumers)
    assert received == Counter(sent)
    assert store.partitions("hot") == 3
    assert len(set(masters_of(store, "hot"))) == (3 if is_cluster(store.redis) else 1)
    assert parts_of(store, "hot", "c", "message_count") == [1000, 1000, 1000]
    assert channel_state(store, "c", "hot") == (0, 0, 0)


@pytest.mark.integration
@pytest.mark.cluster
def test_a_rdy_1_consumer_is_served_from_every_part_and_fin_req_touch_work(processes):
    _, port = processes.broker("--topic-partitions", "3")
    store = Store(connect(processes.redis_url))
    store.control.set_partitions("t", 3)
    consumer = Wire(port)
    assert consumer.sub("t", "c") == (0, b"OK")
    for n in range(6):
        store.publish("t", [b"%d" % n], index=n % 3)
    consumer.command("RDY 1")
    _, _, first, _ = consumer.message()
    consumer.command(b"TOUCH " + first)
    consumer.command(b"REQ " + first + b" 0")
    finished = []
    for n in range(6):
        _, attempts, msg_id, _ = consumer.message()
        finished.append((keys.id_part(msg_id), attempts if msg_id == first else 1))
        consumer.command(b"FIN " + msg_id)
    assert sorted(p for p, _ in finished) == [0, 0, 1, 1, 2, 2]
    assert sorted(a for _, a in finished) == [1, 1, 1, 1, 1, 2]
    consumer.command(b"FIN 0002000000000999")
    assert consumer.frame() == (1, b"E_FIN_FAILED FIN 0002000000000999 failed ID not in flight")
    assert wait_for(lambda: channel_state(store, "c", "t") == (0, 0, 0))


@pytest.mark.integration
@pytest.mark.cluster
def test_raising_the_count_under_load_loses_nothing(processes):
    ports = [processes.broker("--topic-partitions", "2")[1] for _ in range(2)]
    processes.scanner()
    received = Counter()
    consumer = gnsq.Consumer("grow", "c", [addr(p) for p in ports], max_in_flight=20)
    consumer.on_message.connect(lambda _, message: received.update([message.body]), weak=False)
    consumer.start(block=False)
    store = Store(connect(processes.redis_url))
    assert wait_for(lambda: store.reads.read_channel("grow", "c")["client_count"] == 2)
    acked, stopping = [], threading.Event()

    def produce(port):
        wire = Wire(port)
        for n in itertools.count():
            if stopping.is_set():
                return
            body = b"%d-%06d" % (port, n)
            assert wire.pub("grow", body) == (0, b"OK")
            acked.append(body)

    producers = [threading.Thread(target=produce, args=(p,)) for p in ports]
    for producer in producers:
        producer.start()
    time.sleep(1.0)
    admin = relay_admin(processes.redis_url, "create", "grow", "--partitions", "4")
    assert (admin.returncode, admin.stdout) == (0, "grow: 4 partitions (was 2)\n"), admin.stderr
    time.sleep(3.0)
    stopping.set()
    for producer in producers:
        producer.join(10)
    assert wait_for(lambda: sum(received.values()) >= len(acked), timeout=60)
    stop(consumer)
    assert set(received) == set(acked)
    per_part = parts_of(store, "grow", "c", "message_count")
    assert len(per_part) == 4 and all(n > 0 for n in per_part), per_part
    lower = relay_admin(processes.redis_url, "create", "grow", "--partitions", "3")
    assert (lower.returncode, lower.stderr) == (
        1, "relay-admin: topic grow has 4 partitions: the count can only grow (asked for 3)\n")


@pytest.mark.integration
@pytest.mark.cluster
def test_a_busy_part_does_not_starve_the_others(processes):
    """30 messages wait in part 0 and one in each other part: a consumer at RDY 1 gets
    the other parts' within the first 3 deliveries (each round starts one part further)."""
    _, port = processes.broker()
    store = Store(connect(processes.redis_url))
    store.control.set_partitions("t", 3)
    store.subscribe("t", "c", "")
    store.publish("t", [b"busy-%d" % n for n in range(30)], index=0)
    store.publish("t", [b"one"], index=1)
    store.publish("t", [b"two"], index=2)
    consumer = Wire(port)
    assert consumer.sub("t", "c", rdy=1) == (0, b"OK")
    received = []
    for _ in range(32):
        _, _, msg_id, body = consumer.message()
        received.append(body)
        consumer.command(b"FIN " + msg_id)
    assert {b"one", b"two"} <= set(received[:3]), received[:3]
    assert sorted(received) == sorted([b"busy-%d" % n for n in range(30)] + [b"one", b"two"])
