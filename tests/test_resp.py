"""relay/store/resp.py: the group commit's RESP packs and reads as redis-py does."""

import socket
import time
from types import SimpleNamespace

import gevent
import gevent.socket
import pytest
import redis
from redis.exceptions import (BusyLoadingError, ConnectionError, DataError, NoScriptError,
                              ResponseError, TimeoutError)

from relay.deadlines import Deadlines
from relay.store.resp import Replies, pack

COMMANDS = [("EVALSHA", "ab" * 20, 2, "k1", b"k2", b"\x00\xffbody", 0, -3, 10**20, 1.5),
            ("SADD", "relay:topics", "t"), ("WAIT", 1, 100),
            ("SET", bytearray(b"key"), memoryview(b"value"))]


def redis_py_packed(commands: list) -> bytes:
    conn = redis.Redis().connection_pool.make_connection()
    return b"".join(conn.pack_commands(commands))


def test_commands_are_packed_byte_for_byte_as_redis_py_packs_them():
    assert pack(COMMANDS) == redis_py_packed(COMMANDS)
    assert pack(COMMANDS[:3]) == redis_py_packed(COMMANDS[:3])


@pytest.mark.parametrize("bad", [None, True, object()], ids=["none", "bool", "object"])
def test_an_argument_redis_py_refuses_is_its_data_error(bad):
    with pytest.raises(DataError):
        redis_py_packed([("SET", "k", bad)])
    with pytest.raises(DataError):
        pack([("SET", "k", "v"), ("SET", "k", bad)])


@pytest.fixture
def wire():
    """A connection-like object whose socket reads what the test writes to `peer`."""
    ours, peer = socket.socketpair()
    ours.settimeout(0.5)
    conn = SimpleNamespace(_sock=ours, encoder=SimpleNamespace(
        encoding="utf-8", encoding_errors="strict", decode_responses=False))
    yield Replies(conn), peer  # type: ignore[arg-type]
    ours.close()
    peer.close()


def test_replies_are_read_in_order_with_errors_as_their_values(wire):
    replies, peer = wire
    peer.sendall(b":1\r\n$2\r\nok\r\n-NOSCRIPT No matching script\r\n-ERR bad\r\n"
                 b"*2\r\n:7\r\n$-1\r\n")
    first, text, noscript, error, array = replies.read(5)
    assert (first, text, array) == (1, b"ok", [7, None])
    assert type(noscript) is NoScriptError and str(noscript) == "No matching script"
    assert type(error) is ResponseError and str(error) == "bad"


def test_a_reply_split_over_reads_is_read_whole(wire):
    replies, peer = wire
    peer.sendall(b"$5\r\nhel")
    peer.sendall(b"lo\r\n:2")
    peer.sendall(b"\r\n")
    assert replies.read(2) == [b"hello", 2]


def test_a_lost_or_silent_connection_raises_as_redis_py_does(wire):
    replies, peer = wire
    with pytest.raises(TimeoutError, match="^Timeout reading from socket$"):
        replies.read(1)
    peer.sendall(b"-LOADING Redis is loading the dataset in memory\r\n")
    with pytest.raises(BusyLoadingError):
        replies.read(1)
    peer.close()
    with pytest.raises(ConnectionError, match="^Connection closed by server.$"):
        replies.read(1)


def test_given_deadlines_a_read_waits_for_the_socket_and_they_keep_its_timeout():
    """The group commit's reads (a broker's): the socket's own timeout (2 s here) is not
    what ends a read, the connection's socket_timeout kept by Deadlines is."""
    ours, peer = gevent.socket.socketpair()
    ours.settimeout(2.0)
    conn = SimpleNamespace(_sock=ours, socket_timeout=0.3, encoder=SimpleNamespace(
        encoding="utf-8", encoding_errors="strict", decode_responses=False))
    replies = Replies(conn, Deadlines())  # type: ignore[arg-type]
    try:
        gevent.spawn_later(0.05, peer.sendall, b":1\r\n")
        assert replies.read(1) == [1]
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="^Timeout reading from socket$"):
            replies.read(1)
        assert 0.29 < time.monotonic() - started < 0.3 + Deadlines.TICK + 0.1
        peer.sendall(b":2\r\n")
        assert replies.read(1) == [2]
    finally:
        ours.close()
        peer.close()


def test_an_unusable_connection_inside_an_array_raises(wire):
    replies, peer = wire
    peer.sendall(b":1\r\n*2\r\n-LOADING Redis is loading the dataset in memory\r\n:1\r\n")
    with pytest.raises(BusyLoadingError):
        replies.read(2)
