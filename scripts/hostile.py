"""Hostile clients against one broker, measured: what each attack gets, how long an
innocent client's PUB took meanwhile, and the broker's memory before, at its peak and
after. RELIABILITY.md's table of attacks comes from this script.

    .venv/bin/python -m scripts.hostile [--only NAME ...] [--seconds 5]

Each attack runs against a fresh stack (embedded Redis, one broker, one scanner) so the
memory figures of one do not carry over to the next. A witness connection publishes
every 20 ms throughout; its slowest PUB and failed PUBs are reported, and Redis'
slowest command meanwhile (SLOWLOG).
"""

import argparse
import http.client
import json
import re
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
import zlib

import redis

from scripts.bench import Stack

MAGIC = b"  V2"


def size(n: int) -> bytes:
    return struct.pack(">i", n)


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class Conn:
    """A raw V2 connection."""

    def __init__(self, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.sendall(MAGIC)

    def frame(self) -> tuple[int, bytes]:
        head = self._exact(8)
        length, kind = struct.unpack(">ii", head)
        return kind, self._exact(length - 4)

    def reply(self) -> tuple[int, bytes]:
        """The next frame that is not a heartbeat."""
        while True:
            kind, data = self.frame()
            if data != b"_heartbeat_":
                return kind, data

    def _exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError("closed")
            data += chunk
        return data

    def command(self, line: bytes, body: bytes | None = None) -> None:
        self.sock.sendall(line + b"\n" + (b"" if body is None else size(len(body)) + body))

    def until_closed(self, timeout: float) -> bytes:
        """Everything the broker sends until it closes (or `timeout`)."""
        self.sock.settimeout(timeout)
        data = b""
        try:
            while chunk := self.sock.recv(1 << 16):
                data += chunk
        except OSError:
            pass
        return data

    def close(self) -> None:
        self.sock.close()


def last_error(data: bytes) -> str:
    """The last error frame in raw frames (a fatal one ends the connection), and how many
    frames came, else 'closed'."""
    error, frames = "", 0
    while len(data) >= 8:
        length, kind = struct.unpack(">ii", data[:8])
        if kind == 1:
            error = data[8:4 + length].decode("latin-1")[:80]
        frames += 1
        data = data[4 + length:]
    return f"{error} (frame {frames:,})" if error else "closed"


class Witness(threading.Thread):
    """An innocent producer: PUB every 20 ms, timing each."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.worst = 0.0
        self.failed: list[str] = []
        self.count = 0

    def connect(self):
        return Conn(self.port, timeout=60)

    def publish(self, conn) -> str | None:
        """One PUB: None if it was answered OK, else what came back."""
        conn.command(b"PUB witness", b"alive")
        kind, data = conn.reply()
        return data.decode("latin-1")[:100] if kind != 0 else None

    def run(self) -> None:
        conn = self.connect()
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                failure = self.publish(conn)
                if failure:
                    self.failed.append(failure)
            except (OSError, EOFError, http.client.HTTPException) as e:
                self.failed.append(str(e) or type(e).__name__)
                conn.close()
                conn = self.connect()
            self.worst = max(self.worst, time.perf_counter() - started)
            self.count += 1
            time.sleep(0.02)
        conn.close()


class HttpWitness(Witness):
    """The same over one keep-alive HTTP connection: POST /pub every 20 ms."""

    def connect(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def publish(self, conn) -> str | None:
        conn.request("POST", "/pub?topic=witness", b"alive")
        reply = conn.getresponse()
        data = reply.read()
        return None if reply.status == 200 else f"{reply.status} {data[:80].decode()}"


class Memory(threading.Thread):
    """The broker's RSS, sampled every 10 ms: its peak."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = rss_kb(pid)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_kb(self.pid))
            time.sleep(0.01)


# -- attacks: each returns what the attacker got ------------------------------------


def flood(port: int, seconds: float, line: bytes, setup=()) -> str:
    conn = Conn(port, timeout=60)
    for command, body in setup:
        conn.command(command, body)
        conn.reply()
    chunk = line * 16384
    deadline = time.monotonic() + seconds
    sent = 0
    try:
        while time.monotonic() < deadline:
            conn.sock.sendall(chunk)
            sent += len(chunk)
    except OSError as e:
        return f"closed after {sent:,} bytes: {e}"
    conn.close()
    return f"sent {sent / 1e6:,.0f} MB, still connected"


def nop_flood(port: int, seconds: float) -> str:
    return flood(port, seconds, b"NOP\n")


def rdy_flood(port: int, seconds: float) -> str:
    return flood(port, seconds, b"RDY 1\n", [(b"SUB flood c", None)])


def deflated(conn: Conn, level: int = 9):
    """IDENTIFY with deflate: (compressor for what we send, decompressor for replies)."""
    conn.command(b"IDENTIFY", json.dumps({"deflate": True, "deflate_level": level,
                                          "feature_negotiation": True}).encode())
    conn.reply()
    inflate = zlib.decompressobj(-zlib.MAX_WBITS)
    ok = b""
    while len(ok) < 10:         # the OK frame, through deflate
        ok += inflate.decompress(conn.sock.recv(1 << 16))
    return zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS), inflate


def deflate_attack(port: int, seconds: float, plain: bytes) -> str:
    conn = Conn(port, timeout=60)
    compressor, inflate = deflated(conn)
    data = compressor.compress(plain) + compressor.flush(zlib.Z_SYNC_FLUSH)
    try:
        conn.sock.sendall(data)
    except OSError as e:
        return f"{len(data) / 1024:.0f} KB sent: {e}"
    replies = inflate.decompress(conn.until_closed(seconds + 10))
    return f"{len(data) / 1024:.0f} KB sent: {last_error(replies)}"


def deflate_nops(port: int, seconds: float) -> str:
    """32 KB of compressed NOPs (32 MB inflated)."""
    return deflate_attack(port, seconds, b"NOP\n" * (8 << 20))


def deflate_line(port: int, seconds: float) -> str:
    """A 200 MB line with no newline, compressed to about 200 KB."""
    return deflate_attack(port, seconds, b"A" * (200 << 20))


def fin_flood(port: int, seconds: float) -> str:
    """1.6 M FINs of a bogus id in a few writes."""
    conn = Conn(port, timeout=60)
    conn.command(b"SUB fins c")
    conn.reply()
    data = b"FIN 0000000000000000\n" * 1_600_000
    try:
        conn.sock.sendall(data)
    except OSError as e:
        return f"stopped sending: {e} (replies unread, the broker stopped reading)"
    got = conn.until_closed(seconds)
    return f"{len(got) // 1000:,} KB of replies, {last_error(got)}"


def deflate_fins(port: int, seconds: float) -> str:
    """The FIN flood through deflate: 1.6 M FINs in about 40 KB."""
    return deflate_attack(port, seconds, b"SUB fins c\n" + b"FIN 0000000000000000\n" * 1_600_000)


def big_mpub(port: int, seconds: float) -> str:
    """An MPUB of 1,048,575 one-byte messages: legal under --max-body-size."""
    conn = Conn(port, timeout=120)
    count = 1_048_575
    body = size(count) + (size(1) + b"x") * count
    conn.command(b"MPUB big", body)
    kind, data = conn.reply()
    return f"{len(body):,} B body: " + data.decode("latin-1")[:100]


def big_http_mpub(port: int, seconds: float, http_port: int = 0) -> str:
    """HTTP /mpub of exactly 5 MB: 2,621,440 messages of one byte."""
    request = urllib.request.Request(f"http://127.0.0.1:{http_port}/mpub?topic=big",
                                     data=b"a\n" * 2_621_440, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return f"{reply.status} {reply.read()[:80].decode()}"
    except urllib.error.HTTPError as e:
        return f"{e.code} {e.read()[:80].decode()}"


# aborts a second at most: each leaves its port in TIME_WAIT for 60 s on this host, where
# the broker's own connections to Redis take theirs from the same ~28,000; faster (100,000
# in 15 s on a quick machine) the broker stalls on a new connection for want of a port,
# which says nothing of how it takes aborts (the attacker made 17,488 in 15 s)
ABORTS_PER_SECOND = 1_200


def aborted_uploads(http_port: int, seconds: float) -> int:
    """Connect, send 2 bytes of a 10-byte /pub body, close; over and over, at most
    ABORTS_PER_SECOND: how many."""
    start = time.monotonic()
    deadline = start + seconds
    count = 0
    while (now := time.monotonic()) < deadline:
        ahead = count / ABORTS_PER_SECOND - (now - start)
        if ahead > 0:
            time.sleep(ahead)
        sock = socket.create_connection(("127.0.0.1", http_port))
        sock.sendall(b"POST /pub?topic=lf HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nab")
        sock.close()
        count += 1
    return count


def http_aborts(port: int, seconds: float, http_port: int = 0) -> str:
    return f"{aborted_uploads(http_port, seconds):,} aborted uploads"


def http_drip(port: int, seconds: float, http_port: int = 0) -> str:
    """500 connections dripping a /topic/create a few bytes at a time, its body never
    sent, then all closed at once."""
    request = b"POST /topic/create?topic=drip HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n"
    socks = [socket.create_connection(("127.0.0.1", http_port)) for _ in range(500)]
    pause = seconds / (len(request) / 4)
    for i in range(0, len(request), 4):
        for sock in socks:
            sock.send(request[i:i + 4])
        time.sleep(pause)
    for sock in socks:
        sock.close()
    return "500 dripped, closed together"


def http_exchange(http_port: int, data: bytes, timeout: float = 5.0) -> str:
    """The status lines the broker answers `data` with, and whether it closed."""
    sock = socket.create_connection(("127.0.0.1", http_port), timeout=timeout)
    sock.sendall(data)
    got, closed = b"", "open"
    try:
        while chunk := sock.recv(1 << 16):
            got += chunk
        closed = "closed"
    except OSError:
        pass
    sock.close()
    statuses = re.findall(rb"HTTP/1\.[01] (\d{3})", got)
    return ",".join(s.decode() for s in statuses) + f" {closed}"


def topic_made(url: str, topic: str) -> str:
    made = redis.Redis.from_url(url).sismember("relay:topics", topic)
    return f"{topic} {'CREATED' if made else 'not created'}"


def http_smuggle(port: int, seconds: float, http_port: int = 0, url: str = "") -> str:
    """Two Content-Lengths (3 and 74): the rest of the body is a /pub to `smuggled`."""
    hidden = b"POST /pub?topic=smuggled HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx"
    answer = http_exchange(http_port, b"POST /pub?topic=front HTTP/1.1\r\nHost: a\r\n"
                                      b"Content-Length: 3\r\nContent-Length: 74\r\n\r\nabc" +
                           hidden)
    return f"{answer}; {topic_made(url, 'smuggled')}"


def http_half_sent(port: int, seconds: float, http_port: int = 0, url: str = "") -> str:
    """A /topic/create without its blank line, then the client hangs up."""
    sock = socket.create_connection(("127.0.0.1", http_port), timeout=5)
    sock.sendall(b"POST /topic/create?topic=trunc HTTP/1.1\r\nHost: a\r\n")
    sock.shutdown(socket.SHUT_WR)
    sock.recv(100)
    sock.close()
    time.sleep(0.5)
    return topic_made(url, "trunc")


def http_413_then_ping(port: int, seconds: float, http_port: int = 0) -> str:
    """Content-Length 2,000,000 without the body, then GET /ping on the same connection."""
    return http_exchange(http_port, b"POST /pub?topic=big HTTP/1.1\r\nHost: a\r\n"
                                    b"Content-Length: 2000000\r\n\r\n"
                                    b"GET /ping HTTP/1.1\r\nHost: a\r\n\r\n")


def stuck_consumers(port: int, seconds: float, consumers: int = 1) -> str:
    """Consumers at RDY 2500 that never read, on channels of 100 messages of 1 MB."""
    producer = Conn(port, timeout=60)
    conns = []
    for i in range(consumers):
        conn = Conn(port, timeout=60)
        conn.command(f"SUB stuck c{i}".encode())
        conn.reply()
        conns.append(conn)
    body = b"m" * (1 << 20)
    for _ in range(100):
        producer.command(b"PUB stuck", body)
        producer.reply()
    for conn in conns:
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.command(b"RDY 2500")
    time.sleep(seconds)
    for conn in conns:
        conn.close()
    return f"{consumers} consumer(s) never read"


def ten_stuck_consumers(port: int, seconds: float) -> str:
    return stuck_consumers(port, seconds, 10)


ATTACKS = {
    "nop-flood": nop_flood, "rdy-flood": rdy_flood, "deflate-nops": deflate_nops,
    "deflate-line": deflate_line, "fin-flood": fin_flood, "deflate-fins": deflate_fins,
    "big-mpub": big_mpub, "big-http-mpub": big_http_mpub,
    "stuck-consumer": stuck_consumers, "ten-stuck-consumers": ten_stuck_consumers,
    "http-aborts": http_aborts, "http-drip": http_drip, "http-smuggle": http_smuggle,
    "http-half-sent": http_half_sent, "http-413-then-ping": http_413_then_ping,
}
# what an attack takes beyond the TCP port and its length: the HTTP port, Redis's URL
NEEDS = {"big-http-mpub": ("http_port",), "http-aborts": ("http_port",),
         "http-drip": ("http_port",), "http-smuggle": ("http_port", "url"),
         "http-half-sent": ("http_port", "url"), "http-413-then-ping": ("http_port",)}


def slowlog_reset(url: str) -> None:
    """Redis logs every command of 1 ms or more from now on."""
    client = redis.Redis.from_url(url, socket_timeout=30)
    client.config_set("slowlog-log-slower-than", 1000)
    client.config_set("slowlog-max-len", 1024)
    client.slowlog_reset()


def slowest_call(url: str) -> str:
    """The longest command SLOWLOG holds: its ms and what it was (an FCALL's script by
    its first key)."""
    entries = redis.Redis.from_url(url, socket_timeout=30).slowlog_get(1024)
    if not entries:
        return "none over 1 ms"
    worst = max(entries, key=lambda e: e["duration"])
    words = worst["command"].split(b" ")
    if words[0] == b"FCALL":
        what = words[1].decode().rsplit("_", 1)[0]      # the script's name
    else:
        what = b" ".join(words[:2]).decode("latin-1")
    return f"{worst['duration'] / 1000:.1f} ms ({what[:60]}), {len(entries)} over 1 ms"


def registration_lapsed(url: str) -> bool | str:
    """Whether the broker's registration expired (it dropped off relay:brokers)."""
    try:
        return redis.Redis.from_url(url, socket_timeout=30).zcard("relay:brokers") == 0
    except redis.exceptions.RedisError as e:
        return f"unknown ({e})"


def run(name: str, seconds: float, source: str | None = None) -> dict:
    """One attack on a fresh stack whose broker logs at info (its default), with a TCP
    and an HTTP witness."""
    stack = Stack(1, source=source, log_level="info")
    try:
        pid = stack.brokers[0].pid
        time.sleep(1)
        before = rss_kb(pid)
        witness, http_witness = Witness(stack.tcp_port), HttpWitness(stack.http_ports[0])
        memory = Memory(pid)
        for thread in (witness, http_witness, memory):
            thread.start()
        time.sleep(0.2)
        logged = stack.log_size(0)
        given = {"http_port": stack.http_ports[0], "url": stack.url}
        slowlog_reset(stack.url)
        started = time.monotonic()
        outcome = ATTACKS[name](stack.tcp_port, seconds,
                                **{k: given[k] for k in NEEDS.get(name, ())})
        took = time.monotonic() - started
        lapsed = registration_lapsed(stack.url)
        slowest = slowest_call(stack.url)
        time.sleep(2)
        for thread in (witness, http_witness, memory):
            thread.stop.set()
            thread.join(70)
        return {"attack": name, "outcome": outcome, "seconds": round(took, 1),
                "witness_pubs": witness.count, "witness_worst_ms": round(witness.worst * 1000),
                "witness_failed": len(witness.failed), "redis_slowest": slowest,
                "witness_error": witness.failed[0] if witness.failed else "",
                "http_witness_worst_ms": round(http_witness.worst * 1000),
                "http_witness_failed": len(http_witness.failed),
                "http_witness_error": http_witness.failed[0] if http_witness.failed else "",
                "log_kb": round((stack.log_size(0) - logged) / 1024, 1),
                "rss_before_mb": before // 1024, "rss_peak_mb": memory.peak // 1024,
                "rss_after_mb": rss_kb(pid) // 1024, "registration_lapsed": lapsed,
                "broker_alive": stack.brokers[0].poll() is None}
    finally:
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(ATTACKS), default=list(ATTACKS))
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="how long floods last and answers are waited for")
    parser.add_argument("--source", help="a checkout whose relay the broker runs (a revision "
                                         "to compare with)")
    parser.add_argument("--json", action="store_true", help="one JSON object per attack")
    args = parser.parse_args()
    columns = ("attack", "outcome", "seconds", "witness_worst_ms", "witness_failed",
               "http_witness_worst_ms", "http_witness_failed", "redis_slowest", "log_kb",
               "rss_before_mb",
               "rss_peak_mb", "rss_after_mb", "registration_lapsed")
    if not args.json:
        print(" | ".join(columns))
    for name in args.only:
        row = run(name, args.seconds, args.source)
        print(json.dumps(row) if args.json else " | ".join(str(row[c]) for c in columns),
              flush=True)


if __name__ == "__main__":
    main()
