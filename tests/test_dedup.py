"""Idempotent publish (issue 39, relay/store/dedup.py, lib/dedup.lua): the Store on
fakeredis, one Redis and the cluster, a partitioned topic among them; then real brokers
over HTTP, and relay-admin dedup and pub --id as subprocesses."""

import json
import struct
import threading

import pytest

from relay.codec import FRAME_ERROR, FRAME_RESPONSE
from relay.store import keys
from relay.store.data_path import KEYED_BODIES
from relay.store.dedup import key_part, key_problem
from tests.helpers.admin import ok, ok_json, relay_admin, run
from tests.helpers.api import Api
from tests.helpers.store import bodies, now_ms, queue, wait_past
from tests.helpers.wire import Wire, mpub_body


def topic_bodies(store, topic="t", channel="c") -> list:
    return [b for part in store.parts(topic) for b in bodies(queue(store, part, channel))]


# -- the Store -------------------------------------------------------------------------


def test_a_key_seen_within_the_window_publishes_nothing_again(store):
    store.subscribe("t", "c", "b1")
    store.dedup.set_dedup("t", 60_000)
    assert store.dedup.publish_keyed("t", [b"one"], [b"k1"]) == 0
    assert store.dedup.publish_keyed("t", [b"one again"], [b"k1"]) == 1
    assert store.dedup.publish_keyed("t", [b"two", b"one", b"three"], [b"k2", b"k1", b"k3"]) == 1
    assert topic_bodies(store) == [b"one", b"two", b"three"]
    assert store.reads.read_topic("t")["message_count"] == 3


def test_a_key_repeated_in_one_mpub_publishes_once(store):
    store.subscribe("t", "c", "b1")
    store.dedup.set_dedup("t", 60_000)
    assert store.dedup.publish_keyed("t", [b"a", b"b", b"a2"], [b"x", b"y", b"x"]) == 1
    assert topic_bodies(store) == [b"a", b"b"]


def test_with_the_window_off_keys_change_nothing(store):
    store.subscribe("t", "c", "b1")
    assert store.dedup.dedup_window("t") == 0
    assert store.dedup.publish_keyed("t", [b"a", b"a"], [b"k", b"k"]) == 0
    assert topic_bodies(store) == [b"a", b"a"]
    assert store.redis.exists(keys.dedup_key("t")) == 0
    store.dedup.set_dedup("t", 60_000)
    store.dedup.set_dedup("t", 0)
    assert store.dedup.publish_keyed("t", [b"a"], [b"k"]) == 0
    assert len(topic_bodies(store)) == 3


def test_a_key_is_published_again_once_its_window_passed(store):
    store.subscribe("t", "c", "b1")
    store.dedup.set_dedup("t", 50)
    assert store.dedup.publish_keyed("t", [b"a"], [b"k"]) == 0
    wait_past(store, now_ms(store) + 60)
    assert store.dedup.publish_keyed("t", [b"b"], [b"k"]) == 0
    assert topic_bodies(store) == [b"a", b"b"]


def test_memory_is_bounded_by_the_window(store):
    """Expired keys are swept by later publishes, and the whole set expires a window
    after its last write."""
    store.dedup.set_dedup("t", 1000)   # past by the reads below, however slow the machine
    store.dedup.publish_keyed("t", [b"m"] * 50, [b"old%d" % i for i in range(50)])
    wait_past(store, now_ms(store) + 1010)
    store.dedup.publish_keyed("t", [b"m"], [b"new"])
    assert store.redis.zrange(keys.dedup_key("t"), 0, -1) == [b"new"]
    assert 0 < store.redis.pttl(keys.dedup_key("t")) <= 1000


def test_a_deferred_keyed_publish_is_deduplicated_too(store):
    store.subscribe("t", "c", "b1")
    store.dedup.set_dedup("t", 60_000)
    assert store.dedup.publish_keyed("t", [b"a"], [b"k"], defer_ms=60_000) == 0
    assert store.dedup.publish_keyed("t", [b"a"], [b"k"], defer_ms=60_000) == 1
    assert store.reads.read_channel("t", "c")["deferred_count"] == 1


def test_a_key_always_goes_to_the_part_its_hash_picks(store):
    store.control.set_partitions("t", 3)
    store.subscribe("t", "c", "b1")
    store.dedup.set_dedup("t", 60_000)
    assert [store.redis.hget(keys.TopicKeys.of(p).meta, "dedup_ms") for p in store.parts("t")] \
        == [b"60000"] * 3
    ids = [b"key-%d" % i for i in range(30)]
    assert store.dedup.publish_keyed("t", [b"m-" + k for k in ids], ids) == 0
    assert store.dedup.publish_keyed("t", [b"again"] * 30, ids) == 30
    for index, part in enumerate(store.parts("t")):
        expected = [b"m-" + k for k in ids if key_part(k, 3) == index]
        assert bodies(queue(store, part, "c")) == expected
        assert sorted(store.redis.zrange(keys.dedup_key(part), 0, -1)) == \
            sorted(k for k in ids if key_part(k, 3) == index)
    assert {p["keys"] for p in store.dedup.dedup_report("t")["partitions"]} <= set(range(31))
    assert sum(p["keys"] for p in store.dedup.dedup_report("t")["partitions"]) == 30


def test_new_parts_get_the_window(store):
    store.dedup.set_dedup("t", 5000)
    store.control.set_partitions("t", 2)
    assert store.redis.hget(keys.TopicKeys.of(store.parts("t")[1]).meta, "dedup_ms") == b"5000"


def test_a_keyed_mpub_past_one_call_is_split_and_deduplicated_whole(store):
    store.subscribe("t", "c", "b1")
    store.dedup.set_dedup("t", 60_000)
    n = KEYED_BODIES * 2 + 10
    ids = [b"%d" % i for i in range(n)]
    assert len(store.dedup.keyed_publish_ops("t", [b"x"] * n, ids)) == 3
    assert store.dedup.publish_keyed("t", [b"x"] * n, ids) == 0
    assert store.dedup.publish_keyed("t", [b"x"] * n, ids) == n
    assert store.reads.read_channel("t", "c")["depth"] == n


def test_racing_publishers_of_one_key_publish_it_once(store):
    store.subscribe("t", "c", "b1")
    store.dedup.set_dedup("t", 60_000)
    duplicates = []

    def publish(n):
        duplicates.append(store.dedup.publish_keyed("t", [b"body %d" % n], [b"the-key"]))
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


# -- relay-admin (CliRunner) ------------------------------------------------------------


def test_relay_admin_dedup_shows_sets_and_turns_off(store, backend):
    assert ok(backend, "dedup", "t", "--window", "10m") == [
        "t: dedup window 10m", "partition  keys", "0          0"]
    store.dedup.publish_keyed("t", [b"a", b"b"], [b"k1", b"k2"])
    assert ok_json(backend, "dedup", "t") == {
        "topic": "t", "on": True, "window_ms": 600_000,
        "partitions": [{"partition": 0, "keys": 2}]}
    assert ok(backend, "dedup", "t", "--off")[0] == "t: dedup off"
    assert store.dedup.dedup_window("t") == 0
    assert run(backend, "dedup", "t", "--window", "0").output == (
        "relay-admin: a window of 0 remembers nothing: give --off to turn it off "
        "(see relay-admin dedup --help)\n")
    assert run(backend, "dedup", "nope").output == "relay-admin: topic 'nope' not found\n"


# -- real processes: HTTP and relay-admin pub --id --------------------------------------


@pytest.fixture
def api(processes):
    _, port = processes.broker("--max-msg-size", "1000", "--max-body-size", "10000")
    processes.scanner()
    return Api(port, processes.http_ports[port])


def dedup_on(redis_url, topic="t", window="10m"):
    done = relay_admin(redis_url, "dedup", topic, "--window", window)
    assert done.returncode == 0, done.stderr


@pytest.mark.integration
@pytest.mark.cluster
def test_an_http_producer_retrying_a_pub_publishes_once(api, redis_url):
    dedup_on(redis_url)
    api.request("POST", "/channel/create?topic=t&channel=c")
    for _ in range(3):
        status, body, headers = api.request("POST", "/pub?topic=t&id=order-42", b"paid")
        assert (status, body) == (200, b"OK")
    assert headers["X-Relay-Duplicates"] == "1"
    status, body, headers = api.request("POST", "/pub?topic=t&id=order-43", b"shipped")
    assert (status, body, headers["X-Relay-Duplicates"]) == (200, b"OK", "0")
    status, body, headers = api.request("POST", "/pub?topic=t", b"plain")
    assert (status, body, "X-Relay-Duplicates" in headers) == (200, b"OK", False)
    assert api.consume("t", 3) == [b"paid", b"shipped", b"plain"]


@pytest.mark.integration
@pytest.mark.cluster
def test_mpub_with_keys_says_how_many_were_duplicates(api, redis_url):
    dedup_on(redis_url)
    api.request("POST", "/channel/create?topic=t&channel=c")
    status, body, headers = api.request("POST", "/mpub?topic=t&keyed=true",
                                        b"k1 one\nk2 two with spaces\nk1 again\n")
    assert (status, body, headers["X-Relay-Duplicates"]) == (200, b"OK", "1")
    binary = b"".join([struct.pack(">I", 2)] + [struct.pack(">I", len(m)) + m
                                                for m in (b"k2 two", b"k3 three")])
    status, body, headers = api.request("POST", "/mpub?topic=t&binary=true&keyed=true", binary)
    assert (status, body, headers["X-Relay-Duplicates"]) == (200, b"OK", "1")
    assert api.consume("t", 3) == [b"one", b"two with spaces", b"three"]


@pytest.mark.integration
@pytest.mark.parametrize("path, body, error", [
    ("/pub?topic=t&id=", b"x", "ID_EMPTY"),
    ("/pub?topic=t&id=" + "k" * 257, b"x", "ID_TOO_LONG"),
    ("/pub?topic=t&id=%FF", b"x", "ID_NOT_TEXT"),
    ("/pub?topic=t&id=a%20b", b"x", "ID_NOT_TEXT"),
    ("/mpub?topic=t&keyed=true", b"k1 fine\n has-no-key\n", "ID_EMPTY"),
    ("/mpub?topic=t&keyed=true", b"k1 fine\nno-body\n", "MSG_EMPTY"),
    ("/mpub?topic=t&keyed=true", b"k1 fine\n" + b"k" * 300 + b" x\n", "ID_TOO_LONG"),
    ("/mpub?topic=t&keyed=true", b"k1 fine\n\xff body\n", "ID_NOT_TEXT")])
@pytest.mark.reuse_processes     # one broker for its cases (tests/helpers/reuse.py)
def test_a_bad_key_is_a_400_and_publishes_nothing(api, redis_url, path, body, error):
    dedup_on(redis_url)
    api.request("POST", "/channel/create?topic=t&channel=c")
    status, data, headers = api.request("POST", path, body)
    assert (status, json.loads(data)) == (400, {"message": error})
    _, stats = api.json("GET", "/stats?format=json&topic=t")
    assert stats["topics"][0]["message_count"] == 0


@pytest.mark.integration
@pytest.mark.cluster
def test_two_brokers_racing_on_one_key_publish_it_once(processes, redis_url):
    ports = [processes.broker()[1] for _ in range(2)]
    processes.scanner()
    apis = [Api(port, processes.http_ports[port]) for port in ports]
    dedup_on(redis_url)
    apis[0].request("POST", "/channel/create?topic=t&channel=c")
    answers = []

    def publish(api, n):
        answers.append(api.request("POST", "/pub?topic=t&id=the-key", b"body %d" % n))
    threads = [threading.Thread(target=publish, args=(apis[n % 2], n)) for n in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted((status, body, h["X-Relay-Duplicates"]) for status, body, h in answers) == \
        [(200, b"OK", "0")] + [(200, b"OK", "1")] * 9
    assert len(apis[1].consume("t", 1)) == 1


@pytest.mark.integration
@pytest.mark.cluster
def test_relay_admin_pub_with_an_id_run_twice_publishes_once(processes, redis_url):
    processes.scanner()
    dedup_on(redis_url)
    done = relay_admin(redis_url, "pub", "t", "--id", "import-7", input="one\n\ntwo\n")
    assert (done.returncode, done.stdout, done.stderr) == (
        0, "published 2 messages to t, 0 duplicates not published again\n", "")
    done = relay_admin(redis_url, "pub", "t", "--id", "import-7", "--json",
                       input="one\n\ntwo\nthree\n")
    assert json.loads(done.stdout) == {"topic": "t", "published": 1, "duplicates": 2}
    done = relay_admin(redis_url, "dedup", "t", "--json")
    assert sum(p["keys"] for p in json.loads(done.stdout)["partitions"]) == 3
    done = relay_admin(redis_url, "pub", "t", "--id", "two words", input="x\n")
    assert (done.returncode, done.stderr) == (
        2, "relay-admin: --id 'two words': ID_NOT_TEXT: 1-239 bytes of text without spaces "
           "(see relay-admin pub --help)\n")
    done = relay_admin(redis_url, "pub", "u", "--id", "k", input="x\n")
    assert (done.returncode, done.stderr) == (
        0, "relay-admin: topic u has no dedup window, so --id changes nothing "
           "(relay-admin dedup u --window 10m turns it on)\n")


# -- real processes: TCP, for clients that opt in ---------------------------------------


def opted_in(port) -> Wire:
    wire = Wire(port)
    frame_type, data = wire.identify(feature_negotiation=True, relay_dedup=True)
    assert (frame_type, json.loads(data)["relay_dedup"]) == (FRAME_RESPONSE, True)
    return wire


@pytest.mark.integration
@pytest.mark.cluster
def test_tcp_publish_keys_after_identify_relay_dedup(processes, redis_url):
    _, port = processes.broker()
    processes.scanner()
    dedup_on(redis_url)
    wire = opted_in(port)
    assert wire.command("PUB t order-1", b"paid").frame() == (FRAME_RESPONSE, b"OK")
    assert wire.command("PUB t order-1", b"paid").frame() == (
        FRAME_RESPONSE, b"OK DUPLICATES 1")
    assert wire.command("DPUB t 0 order-2", b"later").frame() == (FRAME_RESPONSE, b"OK")
    assert wire.command("MPUB t keyed", mpub_body([b"order-2 later", b"order-3 new",
                                                   b"order-3 twice"])).frame() == (
        FRAME_RESPONSE, b"OK DUPLICATES 2")
    assert wire.mpub("t", [b"no keys"]) == (FRAME_RESPONSE, b"OK")
    wire.close()
    reader = Wire(port)
    reader.identify()
    assert reader.sub("t", "c", rdy=10) == (FRAME_RESPONSE, b"OK")
    # the channel is new: what came before waited in the topic's backlog
    assert sorted(reader.message()[3] for _ in range(4)) == [
        b"later", b"new", b"no keys", b"paid"]


@pytest.mark.integration
def test_other_tcp_clients_see_nsqds_protocol(processes, redis_url):
    """Without relay_dedup, an extra parameter is ignored as nsqd ignores it, and IDENTIFY's
    answer has no relay_dedup."""
    _, port = processes.broker()
    dedup_on(redis_url)
    wire = Wire(port)
    frame_type, data = wire.identify(feature_negotiation=True)
    assert "relay_dedup" not in json.loads(data)
    for _ in range(2):
        assert wire.command("PUB t order-1", b"paid").frame() == (FRAME_RESPONSE, b"OK")
    assert wire.command("MPUB t keyed", mpub_body([b"k body"])).frame() == (
        FRAME_RESPONSE, b"OK")
    _, stats = Api(port, processes.http_ports[port]).json("GET", "/stats?format=json&topic=t")
    assert stats["topics"][0]["message_count"] == 3


@pytest.mark.integration
@pytest.mark.parametrize("line, body, error", [
    ("PUB t " + "k" * 257, b"x", b"E_INVALID PUB invalid key: ID_TOO_LONG"),
    ("PUB t \xff", b"x", b"E_INVALID PUB invalid key: ID_NOT_TEXT"),
    ("DPUB t 0 \x01", b"x", b"E_INVALID DPUB invalid key: ID_NOT_TEXT"),
    ("MPUB t keys", mpub_body([b"k x"]), b"E_INVALID MPUB third parameter must be 'keyed'"),
    ("MPUB t keyed", mpub_body([b"k1 x", b" no key"]), b"E_BAD_BODY MPUB message 2: ID_EMPTY"),
    ("MPUB t keyed", mpub_body([b"k1 x", b"k2"]), b"E_BAD_BODY MPUB message 2: MSG_EMPTY")])
@pytest.mark.reuse_processes     # one broker for its cases (tests/helpers/reuse.py)
def test_a_bad_tcp_key_is_an_error_and_publishes_nothing(processes, redis_url, line, body,
                                                        error):
    _, port = processes.broker()
    dedup_on(redis_url)
    wire = opted_in(port)
    wire.command(line.encode("latin-1"), body)
    assert wire.frame() == (FRAME_ERROR, error)
    assert wire.closed()
    _, stats = Api(port, processes.http_ports[port]).json("GET", "/stats?format=json&topic=t")
    assert stats["topics"][0]["message_count"] == 0
