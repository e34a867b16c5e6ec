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
import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
import zlib

import redis

from relay.store.runner import load_scripts
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

    def run(self) -> None:
        conn = Conn(self.port, timeout=60)
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                conn.command(b"PUB witness", b"alive")
                kind, data = conn.reply()
                if kind != 0:
                    self.failed.append(data.decode("latin-1")[:100])
            except (OSError, EOFError) as e:
                self.failed.append(str(e) or type(e).__name__)
                conn = Conn(self.port, timeout=60)
            self.worst = max(self.worst, time.perf_counter() - started)
            self.count += 1
            time.sleep(0.02)
        conn.close()


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
}


def slowlog_reset(url: str) -> None:
    """Redis logs every command of 1 ms or more from now on."""
    client = redis.Redis.from_url(url, socket_timeout=30)
    client.config_set("slowlog-log-slower-than", 1000)
    client.config_set("slowlog-max-len", 1024)
    client.slowlog_reset()


def slowest_call(url: str) -> str:
    """The longest command SLOWLOG holds: its ms and what it was (an EVALSHA's script by
    its first key)."""
    entries = redis.Redis.from_url(url, socket_timeout=30).slowlog_get(1024)
    if not entries:
        return "none over 1 ms"
    worst = max(entries, key=lambda e: e["duration"])
    words = worst["command"].split(b" ")
    if words[0] == b"EVALSHA":
        names = {script.sha: name for name, script in load_scripts().items()}
        what = names.get(words[1].decode(), words[1].decode()[:12])
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
    stack = Stack(1, source=source)
    try:
        pid = stack.brokers[0].pid
        time.sleep(1)
        before = rss_kb(pid)
        witness, memory = Witness(stack.tcp_port), Memory(pid)
        witness.start()
        memory.start()
        time.sleep(0.2)
        slowlog_reset(stack.url)
        attack = ATTACKS[name]
        kwargs = {"http_port": stack.http_ports[0]} if name == "big-http-mpub" else {}
        started = time.monotonic()
        outcome = attack(stack.tcp_port, seconds, **kwargs)
        took = time.monotonic() - started
        lapsed = registration_lapsed(stack.url)
        slowest = slowest_call(stack.url)
        time.sleep(2)
        witness.stop.set()
        memory.stop.set()
        witness.join(70)
        memory.join()
        return {"attack": name, "outcome": outcome, "seconds": round(took, 1),
                "witness_pubs": witness.count, "witness_worst_ms": round(witness.worst * 1000),
                "witness_failed": len(witness.failed), "redis_slowest": slowest,
                "witness_error": witness.failed[0] if witness.failed else "",
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
               "redis_slowest", "rss_before_mb",
               "rss_peak_mb", "rss_after_mb", "registration_lapsed")
    if not args.json:
        print(" | ".join(columns))
    for name in args.only:
        row = run(name, args.seconds, args.source)
        print(json.dumps(row) if args.json else " | ".join(str(row[c]) for c in columns),
              flush=True)


if __name__ == "__main__":
    main()
