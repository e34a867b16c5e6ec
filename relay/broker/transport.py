"""What a client connection reads from and writes to: the socket, then what IDENTIFY
negotiates on top of it, in nsqd's order (TLS, then snappy or deflate).

Each layer has recv(n), send(data) and unread(). recv gives at most n bytes, b"" when what
it read decoded to nothing yet, and raises EOFError at the end; unread() says whether the
client sent bytes that no recv has taken yet. Compression layers flush on every send, as
nsqd does, so a frame never waits in a compressor.

Inflating is lazy and bounded: deflate gives out at most n bytes per recv and keeps the
rest compressed, and the bytes one read of the socket may inflate to are capped
(`max_inflated`, the largest command a client may send), so 32 KB of compressed NOPs
cannot become 32 MB in memory or seconds of work before anything else runs.
"""

import ssl
import zlib

import snappy

from relay.errors import ConfigError, FatalClientError, RelayError
from relay.sockio import send_all, unread_bytes, wait_readable

TLS_VERSIONS = {"tls1.0": ssl.TLSVersion.TLSv1, "tls1.1": ssl.TLSVersion.TLSv1_1,
                "tls1.2": ssl.TLSVersion.TLSv1_2, "tls1.3": ssl.TLSVersion.TLSv1_3}


class CompressionError(RelayError):
    """The client sent bytes its negotiated compression cannot decode."""


class Plain:
    """A socket, or a TLS socket after the upgrade."""

    def __init__(self, sock):
        self.sock = sock

    def recv(self, n: int) -> bytes:
        data = self.sock.recv(n)
        if not data:
            raise EOFError
        return data

    def recv_when_readable(self, n: int) -> bytes:
        """recv for a reader that expects nothing yet (sockio.wait_readable)."""
        wait_readable(self.sock)
        return self.recv(n)

    def send(self, data: bytes) -> None:
        send_all(self.sock, data)

    def unread(self) -> bool:
        """Bytes in the socket, or decrypted ones a TLS socket holds."""
        pending = getattr(self.sock, "pending", None)
        return bool(pending is not None and pending()) or unread_bytes(self.sock) > 0


class Snappy:
    """nsqd's snappy: the framed stream format, both ways."""

    def __init__(self, inner):
        self.inner = inner
        self.compressor = snappy.StreamCompressor()
        self.decompressor = snappy.StreamDecompressor()

    def recv(self, n: int) -> bytes:
        """Whole frames of at most 64 KB each: a read of n bytes inflates to about 21n
        at most, which the reader's own limits bound."""
        try:
            return self.decompressor.decompress(self.inner.recv(n))
        except EOFError:
            raise
        except Exception as e:
            raise CompressionError(f"snappy: {e}") from None

    def send(self, data: bytes) -> None:
        self.inner.send(self.compressor.add_chunk(data))

    def unread(self) -> bool:
        return self.inner.unread()


class Deflate:
    """nsqd's deflate: raw DEFLATE (no zlib header), a sync flush after each write."""

    def __init__(self, inner, level: int, max_inflated: int):
        """`max_inflated`: the bytes one read of the socket may inflate to."""
        self.inner = inner
        self.compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        self.decompressor = zlib.decompressobj(-zlib.MAX_WBITS)
        self.max_inflated = max_inflated
        self._left = 0      # of max_inflated, for the last read

    def recv(self, n: int) -> bytes:
        """At most n inflated bytes: of what is still compressed, else of a new read."""
        pending = self.decompressor.unconsumed_tail
        if not pending:
            pending = self.inner.recv(n)
            self._left = self.max_inflated
        try:
            data = self.decompressor.decompress(pending, n)
        except zlib.error as e:
            raise CompressionError(f"deflate: {e}") from None
        self._left -= len(data)
        if self._left < 0:
            raise FatalClientError("E_BAD_BODY", f"deflate: one read inflates past "
                                                 f"{self.max_inflated} bytes")
        return data

    def send(self, data: bytes) -> None:
        self.inner.send(self.compressor.compress(data)
                        + self.compressor.flush(zlib.Z_SYNC_FLUSH))

    def unread(self) -> bool:
        return bool(self.decompressor.unconsumed_tail) or self.inner.unread()


# what a client connection reads from and writes to, as IDENTIFY left it
Transport = Plain | Snappy | Deflate


def server_context(options) -> ssl.SSLContext | None:
    """The TLS context of --tls-cert/--tls-key, or None when TLS is off. A file that
    cannot be read or used is a ConfigError naming its option and path."""
    if not options.tls_cert:
        return None
    _check_pem("tls-cert", options.tls_cert, b"-----BEGIN CERTIFICATE-----", "certificate")
    if b"ENCRYPTED" in _check_pem("tls-key", options.tls_key, b"PRIVATE KEY-----",
                                  "private key"):
        raise ConfigError(f"--tls-key {options.tls_key}: encrypted (relay takes no passphrase)")
    if options.tls_root_ca_file:
        _check_pem("tls-root-ca-file", options.tls_root_ca_file,
                   b"-----BEGIN CERTIFICATE-----", "certificate")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[options.tls_min_version]
    try:  # with a password, so that OpenSSL never prompts for one
        context.load_cert_chain(options.tls_cert, options.tls_key, password=b"")
    except ssl.SSLError as e:
        raise ConfigError(f"--tls-key {options.tls_key}: not the key of --tls-cert "
                          f"{options.tls_cert}" if e.reason == "KEY_VALUES_MISMATCH" else
                          f"--tls-cert {options.tls_cert}, --tls-key {options.tls_key}: "
                          f"cannot load them ({e.strerror})") from None
    if options.tls_root_ca_file:
        context.load_verify_locations(options.tls_root_ca_file)
    if options.tls_client_auth_policy:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _check_pem(flag: str, path: str, marker: bytes, what: str) -> bytes:
    """The file's text, if it can be read and holds a PEM `what`."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"--{flag} {path}: {e.strerror}") from None
    if marker not in text:
        raise ConfigError(f"--{flag} {path}: no PEM {what} in it")
    return text


NO_TLS = {"tls_cipher_suite": "", "tls_version": "", "tls_negotiated_protocol": "",
          "tls_negotiated_protocol_is_mutual": False}


def details(tls_sock) -> dict:
    """nsqd's ClientStats TLS fields: version as TLS12/TLS13, the cipher suite's name."""
    version = (tls_sock.version() or "").replace("TLSv", "TLS").replace(".", "")
    return {"tls_cipher_suite": (tls_sock.cipher() or ("",))[0], "tls_version": version,
            "tls_negotiated_protocol": tls_sock.selected_alpn_protocol() or "",
            "tls_negotiated_protocol_is_mutual": True}     # Go's is always true


def common_name(tls_sock) -> str:
    """The CN of the client's certificate, "" without one (sent to the auth server)."""
    cert = tls_sock.getpeercert() or {}
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return ""
