"""Fixtures: the store on both backends (fakeredis and the embedded real server)."""

import os
import shutil
import tempfile

import fakeredis
import pytest
import redis

from relay import embedded
from relay.store import Store


@pytest.fixture(scope="session")
def redis_url():
    """A real Redis: REDIS_URL if given, else the embedded server on a free port."""
    if os.environ.get("RELAY_TEST_REDIS_URL"):
        yield os.environ["RELAY_TEST_REDIS_URL"]
        return
    port = embedded.free_port()
    data = tempfile.mkdtemp(prefix="relay-test-redis-")
    proc = embedded.start(port, data, extra=("--save", "", "--appendonly", "no"))
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(params=["fakeredis", "redis"])
def backend(request):
    """A flushed Redis client; every test using it runs on both backends."""
    if request.param == "fakeredis":
        client = fakeredis.FakeRedis()
    else:
        client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    client.flushdb()
    yield client
    client.flushdb()


@pytest.fixture
def store(backend):
    return Store(backend)
