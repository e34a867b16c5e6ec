"""Liveness, shared by the broker registry and the scanners' shares: heartbeats into a
sorted set scored with their expiry, the live list, ranks and leaving."""

import json

from relay.broker import registry
from relay.liveness import Liveness
from relay.store import keys


def test_members_expire_rank_by_id_and_leave(backend):
    now = [1000.0]
    scanners = Liveness(backend, keys.SCANNERS, 5_000, clock=lambda: now[0])
    assert scanners.rank("b") == (0, 1)
    assert scanners.rank("a") == (0, 2)
    assert scanners.rank("c") == (2, 3)
    assert scanners.live() == ["a", "b", "c"]
    assert backend.zscore(keys.SCANNERS, "a") == 1_005_000
    now[0] += 4.0
    scanners.heartbeat("c")
    now[0] += 1.0   # a and b expire now, c in 4 s
    assert scanners.live() == ["c"]
    assert backend.zrange(keys.SCANNERS, 0, -1) == [b"c"]
    scanners.leave("c")
    assert scanners.live() == [] and scanners.rank("a") == (0, 1)


def test_a_broker_that_stopped_heartbeating_drops_out_with_its_clients(backend):
    for broker_id in ("b1", "b2"):
        broker = registry.Registry(backend, broker_id)
        broker.info = {"tcp_port": "4150"}
        broker.clients = lambda: json.dumps([{"topic": "t", "channel": "c"}])
        broker.announce()
    late = Liveness(backend, keys.BROKERS, registry.TTL_MS, clock=lambda: 0.0)
    late.heartbeat("b2")   # as if b2's last heartbeat was TTL_MS before the epoch
    live = registry.live_brokers(backend)
    assert live == [{"id": "b1", "tcp_port": "4150"}]
    assert registry.live_clients(backend, live) == [{"broker": "b1", "topic": "t",
                                                     "channel": "c"}]
    assert backend.zrange(keys.BROKERS, 0, -1) == [b"b1"]
    registry.Registry(backend, "b1").leave()
    assert registry.live_brokers(backend) == []


def test_a_broker_writes_its_clients_again_only_when_they_changed(backend):
    broker = registry.Registry(backend, "b1")
    broker.info = {"tcp_port": "4150"}
    clients = [{"topic": "t", "channel": "c", "message_count": 0}]
    broker.clients = lambda: json.dumps(clients)
    broker.announce()
    key = keys.broker_clients_key("b1")
    assert json.loads(backend.get(key)) == clients
    backend.set(key, "[]", px=1000)     # what a write would replace
    broker.announce()
    assert backend.get(key) == b"[]" and backend.pttl(key) > 1000   # only renewed
    backend.delete(key)                 # gone (expired, or a Redis restarted empty)
    broker.announce()
    assert json.loads(backend.get(key)) == clients
    clients[0]["message_count"] = 1
    broker.announce()
    assert json.loads(backend.get(key)) == clients
    assert registry.live_clients(backend, registry.live_brokers(backend)) == [
        {"broker": "b1", **clients[0]}]
