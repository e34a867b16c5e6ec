"""The compression layers on their own: deflate gives out what a read inflates to a
bounded piece at a time, and all of it, before it reads again."""

import os
import zlib

import pytest

from relay.broker.transport import Deflate
from relay.errors import FatalClientError


class OneRead:
    """An inner layer that has one read to give; a second one would block for ever."""

    def __init__(self, data: bytes):
        self.data = data

    def recv(self, n: int) -> bytes:
        assert self.data is not None, "read again with inflated bytes still held"
        data, self.data = self.data, None
        return data

    def send(self, data: bytes) -> None:
        pass


def compressed(plain: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return c.compress(plain) + c.flush(zlib.Z_SYNC_FLUSH)


@pytest.mark.parametrize("n", [1, 258, 1000, 4096, 65536])
def test_deflate_gives_everything_a_read_holds_in_pieces_of_n(n):
    plain = b"".join(os.urandom(50) + b"z" * 3000 for _ in range(40))
    layer = Deflate(OneRead(compressed(plain)), 6, max_inflated=len(plain))
    out = b""
    while len(out) < len(plain):
        piece = layer.recv(n)
        assert len(piece) <= n
        out += piece
    assert out == plain


def test_deflate_refuses_a_read_that_inflates_past_its_bound():
    layer = Deflate(OneRead(compressed(b"NOP\n" * 100_000)), 6, max_inflated=100_000)
    with pytest.raises(FatalClientError) as refused:
        while True:
            layer.recv(65536)
    assert refused.value.wire() == b"E_BAD_BODY deflate: one read inflates past 100000 bytes"
