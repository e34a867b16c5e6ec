import json

from click.testing import CliRunner

from relay import admin


def run(backend, *args):
    """relay-admin against the test backend (fakeredis or the real server)."""
    original = admin.redis.Redis.from_url
    admin.redis.Redis.from_url = lambda *a, **k: backend
    try:
        return CliRunner().invoke(admin.main, list(args))
    finally:
        admin.redis.Redis.from_url = original


def test_stats_table_and_json(store, backend):
    store.publish("orders", [b"a", b"b"])
    store.subscribe("orders", "billing", "b1")
    store.publish("orders", [b"c"])
    store.deliver("orders", "billing", [("b1:1", 60000, 1)])
    store.publish("orders", [b"d"], defer_ms=60000)

    result = run(backend, "stats")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "topic   channel  depth  in_flight  deferred  messages  requeued  timed_out  clients",
        "orders           0                 0         4",
        "        billing  2      1          1         4         0         0          1",
    ]

    result = run(backend, "stats", "orders/billing", "--json")
    assert result.exit_code == 0
    channel = json.loads(result.output)["topics"][0]["channels"][0]
    assert channel == {"channel_name": "billing", "paused": False, "ephemeral": False,
                       "depth": 2, "in_flight_count": 1, "deferred_count": 1,
                       "message_count": 4, "requeue_count": 0, "timeout_count": 0,
                       "client_count": 1, "backend_depth": 2,
                       "e2e_processing_latency": {"count": 0, "percentiles": None}}


def test_stats_errors_exit_1_with_one_line(store, backend):
    result = run(backend, "stats", "nope")
    assert (result.exit_code, result.output) == (1, "relay-admin: topic 'nope' not found\n")
    result = run(backend, "stats", "bad name!")
    assert result.exit_code == 1
    assert result.output.startswith("relay-admin: invalid name 'bad name!'")


def test_stats_when_redis_is_unreachable():
    result = CliRunner().invoke(admin.main, ["stats", "--redis-url", "redis://127.0.0.1:1/0"])
    assert result.exit_code == 1
    assert result.output.startswith("relay-admin: redis at redis://127.0.0.1:1/0 is unreachable")
    assert len(result.output.splitlines()) == 1
