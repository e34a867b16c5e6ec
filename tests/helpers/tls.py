"""The test PKI (the `pki` fixture), a raw client that negotiates TLS, snappy or deflate,
and a broker with a certificate from the test PKI."""

import hashlib
import json
import ssl
import zlib

import snappy
import trustme

from relay import embedded
from relay.codec import FRAME_RESPONSE
from tests.helpers.wire import Wire


def write_pki(folder) -> dict:
    """A CA and what it issued, written to `folder`: ca.pem, the broker's certificate for
    127.0.0.1 (server.pem) and its key (server.key), a client certificate with its key
    (client.pem), and other.key, the key of another certificate. Their paths by what they
    are, and the folder's."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("worker-7@example.com", common_name="worker-7")
    paths = {"ca": folder / "ca.pem", "cert": folder / "server.pem",
             "key": folder / "server.key", "client": folder / "client.pem",
             "other_key": folder / "other.key"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    client.private_key_and_cert_chain_pem.write_to_path(str(paths["client"]))
    ca.issue_cert("127.0.0.1").private_key_pem.write_to_path(str(paths["other_key"]))
    return {"folder": str(folder), **{k: str(v) for k, v in paths.items()}}


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
