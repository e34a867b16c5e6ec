"""A raw client that negotiates TLS, snappy or deflate, and a broker with a certificate
from the test PKI (the `pki` fixture)."""

import hashlib
import json
import ssl
import zlib

import snappy

from relay import embedded
from relay.codec import FRAME_RESPONSE
from tests.helpers.wire import Wire


def tls_broker(processes, pki, *extra):
    """A broker with the test PKI's certificate and an HTTPS port; (TCP port, HTTPS port)."""
    https_port = embedded.free_port()
    _, port = processes.broker("--tls-cert", pki["cert"], "--tls-key", pki["key"],
                               "--https-address", f"127.0.0.1:{https_port}", *extra)
    return port, https_port


class Secure(Wire):
    """A raw V2 client whose transport IDENTIFY can upgrade, as a client library does."""

    def __init__(self, port):
        super().__init__(port)
        self.compress = self.decompress = None
        self.pending = b""

    def negotiate(self, pki=None, client_cert=False, **features):
        """IDENTIFY with feature negotiation; upgrade as the response says; returns it."""
        self.command("IDENTIFY", json.dumps({"feature_negotiation": True, **features}).encode())
        kind, data = self.frame()
        if kind != FRAME_RESPONSE:
            return kind, data
        response = json.loads(data)
        if response["tls_v1"]:
            context = ssl.create_default_context(cafile=pki["ca"])
            if client_cert:
                context.load_cert_chain(pki["client"])
            self.sock = context.wrap_socket(self.sock, server_hostname="127.0.0.1")
            assert self.frame() == (FRAME_RESPONSE, b"OK")
        if response["snappy"]:
            encoder, decoder = snappy.StreamCompressor(), snappy.StreamDecompressor()
            self.compress, self.decompress = encoder.add_chunk, decoder.decompress
            self._compressed_from_here()
            assert self.frame() == (FRAME_RESPONSE, b"OK")
        if response["deflate"]:
            encoder, decoder = zlib.compressobj(6, zlib.DEFLATED, -15), zlib.decompressobj(-15)
            self.compress = lambda d: encoder.compress(d) + encoder.flush(zlib.Z_SYNC_FLUSH)
            self.decompress = decoder.decompress
            self._compressed_from_here()
            assert self.frame() == (FRAME_RESPONSE, b"OK")
        return response

    def _compressed_from_here(self):
        """Bytes that came in the same recv as the IDENTIFY response are already the
        compressed stream (seen: 1 run in ~30 read them as a frame header)."""
        self.pending = self.decompress(self.pending) if self.pending else b""

    def send(self, data: bytes):
        self.sock.sendall(self.compress(data) if self.compress else data)
        return self

    def exact(self, n):
        while len(self.pending) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError("closed")
            self.pending += self.decompress(chunk) if self.decompress else chunk
        data, self.pending = self.pending[:n], self.pending[n:]
        return data


def body_of(size: int) -> bytes:
    """A body of `size` bytes that differs for every size."""
    return (hashlib.sha256(str(size).encode()).digest() * (size // 32 + 1))[:size]
