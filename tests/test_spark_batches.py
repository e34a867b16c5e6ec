"""A Spark query's micro-batches in Redis (relay/spark/batches.py) shared with NSQ
consumers and the scanner, without Spark: these need no Java runtime."""

import time

import pytest

from relay.spark.batches import QueryBatches
from relay.store import Store
from relay.store.connection import connect
from tests.helpers.servers import flush
from tests.helpers.store import channel_state
from workers.scanner import Scanner


@pytest.fixture
def store(redis_url):
    """A Store on this test's deployment (one Redis, or the cluster), flushed."""
    flush(redis_url)
    return Store(connect(redis_url))


@pytest.mark.cluster
def test_nsq_consumers_and_spark_share_a_channel(store):
    store.subscribe("events", "spark", "b1")
    store.publish("events", [b"s%d" % i for i in range(6)])
    query = QueryBatches(store, "events", "spark", "spark")
    assert query.claim(4) == 4
    [others] = store.deliver("events", "spark", [("b1:1", 60_000, 10)])
    claimed = query.records(1)
    assert len(claimed) == 4 and len(others) == 2
    assert not set(claimed) & set(others)
    assert query.progress() == {"claimed": 1, "finished": 0, "parked": 0}


@pytest.mark.cluster
def test_a_claim_that_ran_out_is_skipped_when_the_query_claims_it_again(store):
    store.subscribe("events", "spark", "")
    store.publish("events", [b"x%d" % i for i in range(5)])
    query = QueryBatches(store, "events", "spark", "spark", lease_ms=300)
    assert query.claim(10) == 5
    time.sleep(0.4)                     # the driver's machine died: nothing renewed
    Scanner(store).scan_once()
    assert channel_state(store) == (5, 0, 5)
    assert query.confirm(1) == {"claimed": 1, "finished": 1, "parked": 0}
    assert query.records(1) == []
    assert query.claim(10) == 0         # the five copies: finished, not a batch
    assert channel_state(store) == (0, 0, 5)
    store.publish("events", [b"new"])
    assert query.claim(10) == 1
    assert [r[26:] for r in query.records(2)] == [b"new"]


@pytest.mark.cluster
def test_parked_claims_outlast_the_lease_and_come_back_after_the_park(store):
    store.subscribe("events", "spark", "")
    store.publish("events", [b"p%d" % i for i in range(5)])
    query = QueryBatches(store, "events", "spark", "spark", lease_ms=300, park_ms=3000)
    query.claim(10)
    query.park()
    assert query.progress() == {"claimed": 1, "finished": 0, "parked": 1}
    time.sleep(0.5)                     # past the lease
    assert query.renew() == 0           # a new run leaves a parked batch parked
    scanner = Scanner(store)
    scanner.scan_once()
    assert channel_state(store) == (0, 5, 0)
    time.sleep(3)                       # a query that never comes back
    scanner.scan_once()
    assert channel_state(store) == (5, 0, 5)
