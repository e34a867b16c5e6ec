"""A channel's delivery rate limit (issue 60 part 1, relay-admin limit --rate): one bucket
for the channel in Redis, refilled by Redis' clock, that every broker takes from before it
delivers. In the Store on fakeredis, Redis and a cluster (with a partitioned topic), and
against real brokers, NSQ clients, relay-admin, the HTTP API and the console."""

import json
import os
import re
import signal
import time
import urllib.request

import gevent
import pytest

from relay.console.app import create_app
from relay.errors import StoreError
from relay.options import load_options
from relay.store import keys
from relay.store.keys import ChannelKeys
from relay.store.layout import Presence
from relay.store.limits import BadRate, Limit, OldBrokers, Rate, parse_rate
from tests.helpers import gnsq_clients
from tests.helpers.admin import relay_admin
from tests.helpers.api import Api
from tests.helpers.store import bodies, ids, ordered, publish_ordered
from tests.helpers.wait import wait_for


def limited(store, rate="20/s", burst=5, count=100, topic="t"):
    """Channel c of `topic` with `count` messages queued and the rate limit set."""
    store.subscribe(topic, "c", "b1")
    store.publish(topic, [b"%d" % n for n in range(count)])
    assert store.limits.set_rate(topic, "c", parse_rate(rate, burst)) is True


def figures(store, topic="t"):
    state = store.reads.read_channel(topic, "c")
    return state["depth"], state["in_flight_count"]


def test_parse_rate_takes_a_second_a_minute_or_an_hour():
    assert parse_rate("200/s") == Rate(200.0, 20)
    assert parse_rate("200") == Rate(200.0, 20)
    assert parse_rate("30/m", 3) == Rate(0.5, 3)
    assert parse_rate("7200/h") == Rate(2.0, 1)
    assert parse_rate("off") is None
    for bad in ("fast", "0/s", "-5/s", "10/d", "2000000/s"):
        with pytest.raises(BadRate):
            parse_rate(bad)
    with pytest.raises(BadRate, match="burst 0: below 1"):
        parse_rate("10/s", 0)


def test_a_burst_goes_at_once_and_the_rest_waits_in_the_queue_not_in_flight(store):
    limited(store)
    got = store.deliver("t", "c", [("a", 60_000, 30), ("b", 60_000, 30)])
    assert sum(map(len, got)) == 5
    assert bodies(got[0] + got[1]) == [b"0", b"1", b"2", b"3", b"4"]
    assert figures(store) == (95, 5)
    tokens = store.run(store.tokens_op("t", "c", 10))
    assert tokens.taken == 0 and tokens.rate == 20.0
    assert 0 < tokens.wait_ms <= 50          # one message's interval at 20/s


def test_after_a_pause_no_more_than_the_burst_go_at_once(store):
    limited(store, rate="20/s", burst=2)
    assert len(store.deliver("t", "c", [("a", 60_000, 50)])[0]) == 2
    time.sleep(0.4)                     # 8 messages' worth at 20/s: the burst caps it
    assert len(store.deliver("t", "c", [("a", 60_000, 50)])[0]) == 2


def test_the_rate_refills_the_bucket_by_time(store):
    limited(store, rate="50/s", burst=1)
    got, start = 0, time.monotonic()
    while time.monotonic() - start < 1.0:
        got += len(store.deliver("t", "c", [("a", 60_000, 50)])[0])
        time.sleep(0.005)
    assert 35 <= got <= 52


def test_a_call_that_took_nothing_first_gets_nothing_and_learns_the_limit(store):
    limited(store)
    reply = store.run(store.deliver_op("t", "c", [("a", 60_000, 10)]))
    assert list(reply) == [[]] and reply.limited and reply.more
    assert figures(store) == (100, 0)
    taken = store.run(store.deliver_op("t", "c", [("a", 60_000, 3)], taken=True))
    assert len(taken[0]) == 3 and taken.limited


def test_what_a_call_did_not_use_goes_back(store):
    limited(store, burst=10, count=4)
    assert len(store.deliver("t", "c", [("a", 60_000, 10)])[0]) == 4   # took 10, gave 6 back
    store.publish("t", [b"x"] * 10)
    assert len(store.deliver("t", "c", [("a", 60_000, 10)])[0]) == 6


def test_off_removes_the_limit_and_its_bucket(store):
    limited(store)
    store.deliver("t", "c", [("a", 60_000, 10)])
    assert store.limits.set_rate("t", "c", None) is True
    assert store.redis.hmget(ChannelKeys.of("t", "c").meta, "rate_per_s", "rate_tat") \
        == [None, None]
    assert len(store.deliver("t", "c", [("a", 60_000, 50)])[0]) == 50
    assert store.run(store.tokens_op("t", "c", 7)) == (7, 0, None)
    assert store.limits.set_rate("t", "nope", parse_rate("1/s")) is False


def test_a_partitioned_topic_has_one_bucket_for_all_its_parts(store):
    store.control.set_partitions("t", 3)
    limited(store, burst=6, count=60)
    assert len(store.deliver("t", "c", [("a", 60_000, 60)])[0]) == 6
    assert store.deliver("t", "c", [("a", 60_000, 60)])[0] == []     # the other parts too
    for part in store.parts("t"):
        assert store.redis.hget(ChannelKeys.of(part, "c").meta, "rate_per_s") == b"20.0"
    assert [store.redis.hexists(ChannelKeys.of(p, "c").meta, "rate_tat")
            for p in store.parts("t")] == [True, False, False]
    store.control.set_partitions("t", 4)          # the new part gets the rate, not the bucket
    meta = ChannelKeys.of(store.parts("t")[3], "c").meta
    assert store.redis.hmget(meta, "rate_per_s", "rate_burst", "rate_tat") == \
        [b"20.0", b"6", None]


def test_an_ordered_channel_keeps_each_key_in_order_under_a_rate(store):
    ordered(store)
    publish_ordered(store, [("a", b"a1"), ("a", b"a2"), ("b", b"b1"), ("b", b"b2"),
                            ("c", b"c1")])
    store.limits.set_rate("t", "c", parse_rate("20/s", 2))
    first = store.deliver("t", "c", [("o", 60_000, 10)])[0]
    assert bodies(first) == [b"a1", b"b1"]
    store.finish("t", "c", [("o", i.decode()) for i in ids(first)])
    time.sleep(0.15)
    assert bodies(store.deliver("t", "c", [("o", 60_000, 10)])[0]) == [b"c1", b"a2"]


def test_it_combines_with_a_depth_limit_a_ttl_and_pause(store):
    """Expired messages take nothing from the bucket; a paused channel gives back all it
    took; a depth limit still counts the queue."""
    limited(store, burst=3, count=3)
    store.limits.set_limit("t", "c", Limit(5, "reject"))
    store.expiry.set_ttl("t", "c", 300)
    time.sleep(0.35)
    store.publish("t", [b"a", b"b"])                  # 5 queued, the first 3 expired
    with pytest.raises(StoreError, match="is full"):
        store.publish("t", [b"x"])
    assert bodies(store.deliver("t", "c", [("o", 60_000, 10)])[0]) == [b"a", b"b"]
    assert store.reads.read_channel("t", "c")["expired_count"] == 3
    store.expiry.set_ttl("t", "c", None)
    store.publish("t", [b"c", b"d", b"e"])
    store.control.pause_channel("t", "c", True)
    assert store.deliver("t", "c", [("o", 60_000, 10)]) == [[]]
    store.control.pause_channel("t", "c", False)
    time.sleep(0.15)                # what the paused call took went back; the bucket refills
    assert bodies(store.deliver("t", "c", [("o", 60_000, 10)])[0]) == [b"c", b"d", b"e"]


def test_no_rate_is_set_while_a_broker_of_an_earlier_release_runs(store):
    """Its deliver calls would not read the rate: refused until it is gone."""
    store.subscribe("t", "c", "b1")
    Presence(store.redis, "broker", "old-b", 3).heartbeat()
    store.redis.hset(keys.process_key("old-b"), "release", "0.3.0")
    with pytest.raises(OldBrokers) as refused:
        store.limits.set_rate("t", "c", parse_rate("5/s"))
    assert str(refused.value) == ("a rate limit needs every broker at relay 0.4.0 or later, "
                                  "as older ones deliver past it: old-b runs 0.3.0")
    assert store.limits.rate("t", "c") is None
    assert store.limits.set_rate("t", "c", None) is True       # removing one is not refused
    store.redis.hset(keys.process_key("old-b"), "release", "0.4.0")
    assert store.limits.set_rate("t", "c", parse_rate("5/s")) is True


def test_stats_show_the_rate(store):
    limited(store, rate="30/m", burst=2)
    assert store.reads.read_channel("t", "c")["rate_limit"] == 0.5
    report = store.limits.limit_report("t", "c")
    assert (report["rate_per_s"], report["rate_burst"]) == (0.5, 2)


def test_the_console_shows_and_sets_the_rate(store):
    store.control.create_channel("t", "c")
    app = create_app(store, load_options({"console_write": True}, environ={}))
    app.config.update(TESTING=True, WTF_CSRF_ENABLED=False)
    client = app.test_client()
    assert "<th>rate limit</th><td>none</td>" in client.get("/topics/t/c").get_data(True)
    done = client.post("/actions/rate", data={"topic": "t", "channel": "c", "rate": "30/m",
                                              "burst": "2"})
    assert done.status_code == 302
    page = client.get(done.location).get_data(True)
    assert "t/c: at most 30/m, bursts of 2" in page
    assert "<th>rate limit</th><td>at most 30/m, bursts of 2</td>" in page
    assert store.limits.rate("t", "c") == Rate(0.5, 2)
    bad = client.post("/actions/rate", data={"topic": "t", "channel": "c", "rate": "fast"})
    assert bad.status_code == 400 and "not N/s, N/m, N/h or off" in bad.get_data(True)
    client.post("/actions/rate", data={"topic": "t", "channel": "c", "rate": "off"})
    assert store.limits.rate("t", "c") is None


# -- real brokers, NSQ clients, relay-admin and the HTTP API --------------------------------

def admin(url, *args):
    done = relay_admin(url, *args)
    return done.returncode, done.stdout.strip(), done.stderr.strip()


def one_broker(processes, *args) -> tuple:
    """A broker: (its TCP port, its HTTP port, an Api on it)."""
    _, port = processes.broker(*args)
    http = processes.http_ports[port]
    return port, http, Api(port, http)


def made(api, topic="t", count=0):
    assert api.request("POST", f"/topic/create?topic={topic}")[0] == 200
    assert api.request("POST", f"/channel/create?topic={topic}&channel=c")[0] == 200
    if count:
        body = b"\n".join(b"%d" % n for n in range(count))
        assert api.request("POST", f"/mpub?topic={topic}", body)[0] == 200


class Received:
    """Bodies gnsq consumers received (each FINned), with when: consumers that count in
    windows of time IDENTIFY with an output buffer of 25 ms (nsqd's least), not nsqd's 250 ms, by
    which a window would hold one flush more or less."""

    def __init__(self):
        self.at: list[tuple[float, bytes]] = []

    def __call__(self, message):
        self.at.append((time.monotonic(), message.body))
        message.finish()

    def within(self, start: float, end: float) -> int:
        return sum(1 for t, _ in self.at if start <= t < end)

    def bodies(self) -> set:
        return {body for _, body in self.at}


@pytest.mark.integration
def test_two_brokers_and_four_consumers_share_one_rate(processes, redis_url):
    _, one = processes.broker()
    _, two = processes.broker()
    api = Api(one, processes.http_ports[one])
    made(api, count=400)
    assert admin(redis_url, "limit", "t/c", "--rate", "20/s", "--burst", "5")[0] == 0
    got = Received()
    consumers = [gnsq_clients.consumer(port, "t", "c", got, max_in_flight=50,
                                       output_buffer_timeout=25)
                 for port in (one, one, two, two)]
    try:
        assert wait_for(lambda: got.at, timeout=10)
        first = got.at[0][0]
        gevent.sleep(3.2)
        in_3s = got.within(first, first + 3.0)
    finally:
        gnsq_clients.stop(*consumers)
    assert 45 <= in_3s <= 5 + 3 * 20 + 1          # the burst, then 20/s
    assert len(got.bodies()) == len(got.at)


def metrics(http_port) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics").read().decode()


def tokens_calls(http_port) -> float:
    """The broker's calls to rate limits' buckets so far (its /metrics)."""
    found = re.search(r'relay_redis_script_calls_total\{script="tokens"\} (\S+)',
                      metrics(http_port))
    return float(found.group(1)) if found else 0.0


def settled_tokens_calls(http_port, quiet: float = 1.5) -> float:
    """tokens_calls once it has not moved for `quiet` s: a channel new on a broker looks
    once more when the broker first reads its topic's version (wakeups.CATCH_UP)."""
    seen, since = tokens_calls(http_port), time.monotonic()
    while time.monotonic() - since < quiet:
        gevent.sleep(0.25)
        now = tokens_calls(http_port)
        if now != seen:
            seen, since = now, time.monotonic()
    return seen


@pytest.mark.integration
def test_a_limited_channel_with_nothing_to_deliver_asks_its_bucket_nothing(processes, redis_url):
    port, http, api = one_broker(processes)
    made(api)
    assert admin(redis_url, "limit", "t/c", "--rate", "20/s")[0] == 0
    got = Received()
    consumer = gnsq_clients.consumer(port, "t", "c", got, max_in_flight=50)
    try:
        assert api.request("POST", "/pub?topic=t", b"first")[0] == 200
        assert wait_for(lambda: got.bodies() == {b"first"})
        idle = settled_tokens_calls(http)     # after the first version check (CATCH_UP)
        gevent.sleep(2.0)
        assert tokens_calls(http) == idle
        assert api.request("POST", "/pub?topic=t", b"second")[0] == 200
        assert wait_for(lambda: got.bodies() == {b"first", b"second"})
    finally:
        gnsq_clients.stop(consumer)
    assert tokens_calls(http) > idle


@pytest.mark.integration
def test_a_rate_changed_mid_run_counts_within_a_second(processes, redis_url):
    port, _, api = one_broker(processes)
    made(api, count=300)
    assert api.json("POST", "/channel/limit?topic=t&channel=c&rate=5&burst=1")[0] == 200
    got = Received()
    consumer = gnsq_clients.consumer(port, "t", "c", got, max_in_flight=50,
                                     output_buffer_timeout=25)
    try:
        assert wait_for(lambda: got.at, timeout=10)
        gevent.sleep(1.0)
        raised = time.monotonic()
        status, report = api.json("POST", "/channel/limit?topic=t&channel=c&rate=100/s")
        assert (status, report["rate_per_s"], report["rate_burst"]) == (200, 100.0, 10)
        gevent.sleep(2.2)
        slow, fast = got.within(0, raised), got.within(raised + 1.0, raised + 2.0)
    finally:
        gnsq_clients.stop(consumer)
    assert slow <= 1 + 5 * 2 and 80 <= fast <= 111


@pytest.mark.integration
def test_a_broker_killed_under_a_rate_loses_nothing_and_the_rate_holds(processes, redis_url):
    processes.scanner()
    victim_proc, victim = processes.broker("--msg-timeout", "2s")
    _, survivor = processes.broker("--msg-timeout", "2s")
    api = Api(survivor, processes.http_ports[survivor])
    made(api, count=200)
    assert admin(redis_url, "limit", "t/c", "--rate", "20/s", "--burst", "5")[0] == 0
    got = Received()
    consumers = [gnsq_clients.consumer(port, "t", "c", got, max_in_flight=50)
                 for port in (victim, survivor)]
    try:
        assert wait_for(lambda: len(got.at) >= 10, timeout=10)
        os.kill(victim_proc.pid, signal.SIGKILL)
        victim_proc.wait(5)
        killed = time.monotonic()
        gevent.sleep(3.2)
        after = got.within(killed + 1.0, killed + 3.0)
        assert admin(redis_url, "limit", "t/c", "--rate", "off")[0] == 0
        assert wait_for(lambda: len(got.bodies()) == 200, timeout=20)
    finally:
        gnsq_clients.stop(*consumers)
    assert after <= 2 * 20 + 5 + 1
    assert got.bodies() == {b"%d" % n for n in range(200)}


@pytest.mark.integration
def test_relay_admin_stats_http_and_metrics_show_the_rate(processes, redis_url):
    port, http, api = one_broker(processes)
    made(api)
    code, out, _ = admin(redis_url, "limit", "t/c", "--rate", "30/m", "--burst", "2")
    assert (code, out) == (0, "t/c: no depth limit (depth 0)\nt/c: at most 30/m, bursts of 2")
    code, out, _ = admin(redis_url, "limit", "t/c", "--json")
    assert (json.loads(out)["rate_per_s"], json.loads(out)["rate_burst"]) == (0.5, 2)
    code, out, _ = admin(redis_url, "stats")
    assert out.splitlines()[0].split()[-1] == "rate" and "30/m" in out.splitlines()[2]
    for args, error in [(("--rate", "fast"), "rate 'fast': not N/s, N/m, N/h or off"),
                        (("--burst", "3"), "--burst goes with --rate"),
                        (("--rate", "off", "--burst", "3"), "--burst goes with --rate")]:
        code, _, err = admin(redis_url, "limit", "t/c", *args)
        assert code == 2 and error in err
    for query, error in [("rate=fast", "INVALID_ARG_RATE"), ("rate=5&burst=0", "INVALID_ARG_BURST"),
                         ("rate=off&burst=2", "INVALID_ARG_BURST")]:
        assert api.json("POST", f"/channel/limit?topic=t&channel=c&{query}") == \
            (400, {"message": error})
    _, stats = api.json("GET", "/stats?format=json&topic=t")
    assert stats["topics"][0]["channels"][0]["rate_limit"] == 0.5
    assert 'relay_channel_rate_limit{channel="c",topic="t"} 0.5' in metrics(http)
    assert admin(redis_url, "limit", "t/c", "--rate", "off")[1] == "t/c: no depth limit (depth 0)"
    assert "relay_channel_rate_limit{" not in metrics(http)
