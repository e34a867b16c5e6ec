"""relay's HTTP extensions for message TTLs, depth limits and dedup windows
(relay/broker/http/controls.py) through a real broker: each shown, set and cleared, on
one Redis and on a cluster with a partitioned topic, and bad input answered in nsqd's
form with nothing changed."""

import pytest

from tests.helpers.api import Api

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out


def made(processes, *broker_args) -> Api:
    _, port = processes.broker(*broker_args)
    api = Api(port, processes.http_ports[port])
    assert api.request("POST", "/topic/create?topic=t")[0] == 200
    assert api.request("POST", "/channel/create?topic=t&channel=c")[0] == 200
    return api


@pytest.mark.cluster    # on one Redis and on a cluster (tests/conftest.py)
def test_ttl_limit_and_dedup_over_http_on_a_partitioned_topic(processes):
    api = made(processes, "--topic-partitions", "2")
    assert api.json("GET", "/topic/ttl?topic=t") == (200, {
        "topic": "t", "ttl_ms": None,
        "channels": [{"channel": "c", "ttl_ms": None, "source": None}]})
    assert api.json("POST", "/topic/ttl?topic=t&ttl=10m") == (200, {
        "topic": "t", "ttl_ms": 600_000,
        "channels": [{"channel": "c", "ttl_ms": 600_000, "source": "topic"}]})
    assert api.request("POST", "/channel/create?topic=t&channel=d")[0] == 200
    assert api.json("POST", "/channel/ttl?topic=t&channel=c&ttl=0") == (200, {
        "topic": "t", "ttl_ms": 600_000,
        "channels": [{"channel": "c", "ttl_ms": 0, "source": "channel"}]})
    assert api.json("GET", "/topic/ttl?topic=t")[1]["channels"] == [
        {"channel": "c", "ttl_ms": 0, "source": "channel"},
        {"channel": "d", "ttl_ms": 600_000, "source": "topic"}]
    assert api.json("POST", "/channel/ttl?topic=t&channel=c&off=true")[1]["channels"] == [
        {"channel": "c", "ttl_ms": 600_000, "source": "topic"}]

    assert api.json("POST", "/channel/limit?topic=t&channel=c&max_depth=3") == (200, {
        "topic": "t", "channel": "c", "max_depth": 3, "overflow": "reject",
        "partitions": 2, "part_max_depth": 2, "depth": 0, "overflow_count": 0,
        "rate_per_s": None, "rate_burst": None})
    for i in range(4):                  # two a part: the publishes go to the parts in turn
        assert api.request("POST", "/pub?topic=t", b"m%d" % i)[:2] == (200, b"OK")
    assert api.json("POST", "/pub?topic=t", b"m4") == (
        503, {"message": "channel t/c is full (max depth 3)"})
    status, report = api.json("POST", "/channel/limit?topic=t&channel=c&max_depth=3"
                                      "&overflow=drop-oldest")
    assert (status, report["overflow"], report["depth"]) == (200, "drop-oldest", 4)
    assert api.json("POST", "/channel/limit?topic=t&channel=c&off=true")[1]["max_depth"] \
        is None

    status, report = api.json("POST", "/topic/dedup?topic=t&window=10m")
    assert (status, report["on"], report["window_ms"]) == (200, True, 600_000)
    for duplicates in ("0", "1"):
        status, body, headers = api.request("POST", "/pub?topic=t&id=order-42", b"paid")
        assert (status, body, headers["X-Relay-Duplicates"]) == (200, b"OK", duplicates)
    status, report = api.json("GET", "/topic/dedup?topic=t")
    assert sorted(p["keys"] for p in report["partitions"]) == [0, 1]
    assert api.json("POST", "/topic/dedup?topic=t&off=true")[1]["on"] is False
    assert api.json("POST", "/topic/dedup?topic=new&window=1m") == (
        404, {"message": "TOPIC_NOT_FOUND"})      # relay-admin dedup would make it


def test_bad_input_changes_nothing(processes):
    api = made(processes)
    for path, code, message in [
            ("/topic/ttl?topic=nope&ttl=1m", 404, "TOPIC_NOT_FOUND"),
            ("/channel/ttl?topic=t&channel=x&ttl=1m", 404, "CHANNEL_NOT_FOUND"),
            ("/channel/ttl?topic=t&ttl=1m", 400, "MISSING_ARG_CHANNEL"),
            ("/channel/ttl?topic=t&channel=c&ttl=1m&off=true", 400, "INVALID_ARG_OFF"),
            ("/topic/ttl?topic=t&ttl=soon", 400, "INVALID_ARG_TTL"),
            ("/topic/ttl?topic=t&ttl=-1s", 400, "INVALID_ARG_TTL"),
            ("/topic/ttl?topic=t", 400, "MISSING_ARG_TTL"),
            ("/topic/ttl?topic=t&ttl=1m&off=true", 400, "INVALID_ARG_OFF"),
            ("/channel/limit?topic=t", 400, "MISSING_ARG_CHANNEL"),
            ("/channel/limit?topic=t&channel=x&max_depth=3", 404, "CHANNEL_NOT_FOUND"),
            ("/channel/limit?topic=t&channel=c&max_depth=0", 400, "INVALID_ARG_MAX_DEPTH"),
            ("/channel/limit?topic=t&channel=c&max_depth=lots", 400, "INVALID_ARG_MAX_DEPTH"),
            ("/channel/limit?topic=t&channel=c&max_depth=3&overflow=explode", 400,
             "INVALID_ARG_OVERFLOW"),
            ("/channel/limit?topic=t&channel=c&overflow=reject", 400, "MISSING_ARG_MAX_DEPTH"),
            ("/channel/limit?topic=t&channel=c&overflow=", 400, "MISSING_ARG_MAX_DEPTH"),
            ("/channel/limit?topic=t&channel=c&off=true&overflow=reject", 400,
             "INVALID_ARG_OFF"),
            ("/topic/dedup?topic=t&window=0", 400, "INVALID_ARG_WINDOW"),
            ("/topic/dedup?topic=t&window=soon", 400, "INVALID_ARG_WINDOW"),
            ("/topic/dedup?topic=t", 400, "MISSING_ARG_WINDOW"),
            ("/topic/dedup?topic=bad!name&window=1m", 400, "INVALID_TOPIC")]:
        assert api.json("POST", path) == (code, {"message": message}), path
    assert api.json("GET", "/topic/ttl?topic=t")[1] == {
        "topic": "t", "ttl_ms": None, "channels": [{"channel": "c", "ttl_ms": None,
                                                     "source": None}]}
    assert api.json("GET", "/channel/limit?topic=t&channel=c")[1]["max_depth"] is None
    assert api.json("GET", "/topic/dedup?topic=t")[1]["on"] is False
