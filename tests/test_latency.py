"""End-to-end processing latency: buckets, percentiles, and /stats of real brokers."""

import random
import re
import time

import pytest

from relay.store import stats
from relay.store.latency import NO_LATENCY, E2eLatency, bucket, bucket_value, describe, human, \
    percentiles
from tests.helpers.api import Api
from tests.helpers.clock import Clock
from tests.helpers.wait import wait_until
from tests.helpers.wire import FRAME_RESPONSE, Wire


def test_bucket_value_is_within_one_percent_of_what_went_in():
    for ns in (1, 999, 1_000, 123_456, 5_000_000, 61_000_000_000):
        assert abs(bucket_value(bucket(ns)) - ns) <= 0.01 * ns + 1


def test_percentiles_match_the_exact_ones_within_one_percent():
    rng = random.Random(7)
    samples = [int(rng.lognormvariate(15, 1.5)) for _ in range(20_000)]
    counts: dict = {}
    for s in samples:
        counts[bucket(s)] = counts.get(bucket(s), 0) + 1
    result = percentiles(counts, (0.5, 0.99, 1.0))
    assert result["count"] == 20_000
    ordered = sorted(samples)
    for p, q in zip(result["percentiles"], (0.5, 0.99, 1.0)):
        exact = ordered[min(int(q * len(ordered)), len(ordered) - 1)]
        assert p["quantile"] == q
        assert abs(p["value"] - exact) <= 0.011 * exact


def test_no_quantiles_is_what_nsqd_shows_without_the_option():
    assert percentiles({10: 3}, ()) == NO_LATENCY == {"count": 0, "percentiles": None}
    assert percentiles({}, (0.99,)) == {"count": 0,
                                         "percentiles": [{"quantile": 0.99, "value": 0}]}


def test_human_reads_as_nsqd_prints_nanoseconds():
    assert [human(v) for v in (999, 1500, 2_500_000, 3_210_000_000)] == [
        "999.0ns", "1.5us", "2.5ms", "3.2s"]
    assert describe({"count": 2, "percentiles": [{"quantile": 0.99, "value": 2_500_000},
                                                  {"quantile": 0.5, "value": 1500}]}) \
        == "2.5ms, 1.5us"
    assert describe(NO_LATENCY) == ""


def test_windows_of_several_brokers_add_up_and_age_out(store):
    clock = Clock(time.time() // 5 * 5 + 0.02)
    a = E2eLatency((0.5,), 10_000, clock)
    b = E2eLatency((0.5,), 10_000, clock)
    published = int((clock.now - 0.01) * 1e9)
    a.record("t", "c", published)
    b.record("t", "c", published)
    b.record("t", "d", published)
    a.flush(store)
    b.flush(store)
    [c, d] = a.read(store, [("t", "c"), ("t", "d")])
    assert (sum(c.values()), sum(d.values())) == (2, 1)
    assert percentiles(c, (0.5,))["percentiles"][0]["value"] == pytest.approx(10_000_000,
                                                                             rel=0.01)
    clock.now += 5.0
    assert sum(a.read(store, [("t", "c")])[0].values()) == 2
    clock.now += 5.0
    assert a.read(store, [("t", "c")]) == [{}]


def test_collect_merges_channels_into_the_topic(store):
    store.control.create_channel("t", "c")
    store.control.create_channel("t", "d")
    store.control.create_topic("u")
    clock = Clock(time.time())
    latency = E2eLatency((1.0,), 60_000, clock)
    latency.record("t", "c", int((clock.now - 0.1) * 1e9))
    latency.record("t", "d", int((clock.now - 1) * 1e9))
    latency.flush(store)
    data = stats.collect(store, latency=latency)
    t, u = data["topics"]
    assert [c["e2e_processing_latency"]["count"] for c in t["channels"]] == [1, 1]
    assert t["e2e_processing_latency"]["count"] == 2
    assert t["e2e_processing_latency"]["percentiles"][0]["value"] == pytest.approx(1e9,
                                                                                  rel=0.01)
    assert u["e2e_processing_latency"] == NO_LATENCY


def _consume_slowly(port, n, hold):
    wire = Wire(port)
    wire.identify()
    assert wire.sub("t", "c", rdy=n) == (FRAME_RESPONSE, b"OK")
    for _ in range(n):
        msg_id = wire.message()[2]
        time.sleep(hold)
        wire.command(b"FIN " + msg_id)
    assert wire.nothing()
    wire.close()


@pytest.mark.integration
def test_stats_of_every_broker_show_publish_to_fin_percentiles(processes):
    flags = ("--e2e-processing-latency-percentile", "1.0,0.5")
    _, port_a = processes.broker(*flags)
    _, port_b = processes.broker(*flags)
    a, b = Api(port_a, processes.http_ports[port_a]), Api(port_b, processes.http_ports[port_b])
    assert a.request("POST", "/topic/create?topic=t")[0] == 200
    assert a.request("POST", "/channel/create?topic=t&channel=c")[0] == 200
    assert a.request("POST", "/mpub?topic=t", b"1\n2\n3\n4")[0] == 200
    _consume_slowly(port_a, 4, 0.2)
    _, data = wait_until(
        lambda: b.json("GET", "/stats?format=json"),
        lambda reply: reply[1]["topics"][0]["channels"][0]["e2e_processing_latency"][
            "count"] == 4,
        timeout=5, interval=0.2)
    latency = data["topics"][0]["channels"][0]["e2e_processing_latency"]
    assert latency["count"] == 4
    assert [p["quantile"] for p in latency["percentiles"]] == [1.0, 0.5]
    slowest, median = (p["value"] for p in latency["percentiles"])
    assert 0.79e9 <= slowest <= 2e9
    assert 0.39e9 <= median < slowest
    assert data["topics"][0]["e2e_processing_latency"]["count"] == 4
    _, text, _ = b.request("GET", "/stats")
    assert re.search(r"msgs: 4 +e2e%: \d+\.\dms, \d+\.\dms\n", text.decode())
    assert b.json("GET", "/config/e2e_processing_latency_percentiles") == (200, [1.0, 0.5])
    assert b.json("GET", "/config/e2e_processing_latency_window_time") == (200, 600_000_000_000)


@pytest.mark.integration
def test_without_the_option_stats_show_no_percentiles(broker, processes):
    api = Api(broker, processes.http_ports[broker])
    assert api.request("POST", "/topic/create?topic=t")[0] == 200
    assert api.request("POST", "/channel/create?topic=t&channel=c")[0] == 200
    assert api.request("POST", "/pub?topic=t", b"x")[0] == 200
    _consume_slowly(broker, 1, 0)
    _, data = api.json("GET", "/stats?format=json")
    assert data["topics"][0]["channels"][0]["e2e_processing_latency"] == NO_LATENCY
