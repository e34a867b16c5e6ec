"""A load generator that speaks the NSQ TCP protocol itself (no relay imports), so it
measures what any client sees. Prints one JSON line of results per run.

    loadgen.py pub  --port 4150 --producers 4 --size 100 --seconds 10
    loadgen.py mpub --port 4150 --producers 2 --batch 100 --size 1024 --seconds 10
    loadgen.py sub  --port 4150 --consumers 4 --rdy 100 --messages 200000 --size 100
    loadgen.py e2e  --port 4150 --producers 1 --batch 100 --consumers 4 --rdy 100 --size 200
                    [--rate 10000] --seconds 10

Modes: pub (one PUB at a time per producer), mpub (batches of --batch), sub (drain a
pre-filled topic, FIN each message), e2e (producers and consumers at once; the publish
time is in the body; reports end-to-end latency). --rate fixes the total publish rate.
--keyed (pub, mpub): every message with a publish key of its own, as relay's clients
that IDENTIFY with relay_dedup send them (relay/broker/protocol/keyed.py).

Rates and CPU cover the timed window only (`window_start` .. `window_end`, wall clock):
from the common start to the last publish (pub, mpub) or the last message received
(sub, e2e); connecting, the sub prefill and the e2e drain wait are outside it. e2e
exits 1 if a message published was not received.
"""

import argparse
import json
import multiprocessing as mp
import os
import socket
import struct
import sys
import time

MAGIC = b"  V2"
_size = struct.Struct(">i")
_header = struct.Struct(">ii")
_stamp = struct.Struct(">q")
E2E_DRAIN_IDLE = 1.0    # e2e consumers stop once nothing came for this long after publishing
E2E_DRAIN_MAX = 30.0    # ... or this long after publishing ended


class Conn:
    def __init__(self, host, port, connect_timeout=None):
        self.sock = socket.create_connection((host, port), timeout=connect_timeout)
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(MAGIC)
        self.buf = bytearray()

    def frames(self):
        """Yield (type, data) for every complete frame after one recv."""
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise EOFError("server closed the connection")
        self.buf += chunk
        pos, buf, n = 0, self.buf, len(self.buf)
        while n - pos >= 8:
            size, kind = _header.unpack_from(buf, pos)
            if n - pos - 4 < size:
                break
            yield kind, bytes(buf[pos + 8:pos + 4 + size])
            pos += 4 + size
        del buf[:pos]

    def expect_ok(self, count=1):
        got = 0
        while got < count:
            for kind, data in self.frames():
                if kind == 1:
                    raise RuntimeError(data.decode())
                if data == b"_heartbeat_":
                    self.sock.sendall(b"NOP\n")
                    continue
                got += 1


def identify_command(settings):
    data = json.dumps(settings).encode()
    return b"IDENTIFY\n" + _size.pack(len(data)) + data


def pub_command(topic, body):
    return b"PUB " + topic + b"\n" + _size.pack(len(body)) + body


def keyed_pub_command(topic, key, body):
    return b"PUB " + topic + b" " + key + b"\n" + _size.pack(len(body)) + body


def keyed_mpub_command(topic, keys, bodies):
    return mpub_command(topic, [k + b" " + b for k, b in zip(keys, bodies)], b" keyed")


def mpub_command(topic, bodies, params=b""):
    payload = _size.pack(len(bodies)) + b"".join(_size.pack(len(b)) + b for b in bodies)
    return b"MPUB " + topic + params + b"\n" + _size.pack(len(payload)) + payload


def body_now(size):
    return _stamp.pack(time.time_ns()) + b"x" * max(0, size - 8)


def producer(args, index, start_at, results):
    """Publish until the deadline; one round trip (PUB or MPUB) at a time."""
    conn = Conn(args.host, args.port)
    topic = args.topic.encode()
    batch = args.batch if args.mode in ("mpub", "e2e") else 1
    if args.keyed:
        conn.sock.sendall(identify_command({"relay_dedup": True}))
        conn.expect_ok()
    key_prefix = b"%d-%d-" % (os.getpid(), index)
    per_second = args.rate / args.producers if args.rate else None
    while time.time() < start_at:
        time.sleep(0.001)
    end = start_at + args.seconds
    sent = trips = 0
    cpu = time.process_time()
    while True:
        now = time.time()
        if now >= end:
            break
        if per_second and sent > (now - start_at) * per_second:
            time.sleep(min(0.0005, end - now))
            continue
        bodies = [body_now(args.size) for _ in range(batch)]
        if args.keyed:
            keys = [key_prefix + b"%d" % (sent + i) for i in range(batch)]
            conn.sock.sendall(keyed_pub_command(topic, keys[0], bodies[0]) if batch == 1
                              else keyed_mpub_command(topic, keys, bodies))
        else:
            conn.sock.sendall(pub_command(topic, bodies[0]) if batch == 1
                              else mpub_command(topic, bodies))
        conn.expect_ok()
        sent += batch
        trips += 1
    results.put({"role": "producer", "sent": sent, "round_trips": trips, "last": time.time(),
                 "cpu_s": time.process_time() - cpu})


def consumer(args, index, start_at, results):
    """Consume and FIN; in e2e mode record publish-to-receive latencies (ms)."""
    conn = Conn(args.host, args.port)
    conn.sock.sendall(identify_command({"output_buffer_timeout": args.output_buffer_timeout}) +
                      b"SUB " + args.topic.encode() + b" " + args.channel.encode() + b"\n")
    received, latencies = 0, []
    target = args.messages // args.consumers if args.mode == "sub" else None
    conn.sock.settimeout(0.2)
    first = last = None
    publishing_ends = start_at + args.seconds
    while time.time() < start_at:
        time.sleep(0.001)
    cpu = time.process_time()
    conn.sock.sendall(b"RDY %d\n" % args.rdy)
    while True:
        if args.mode == "e2e" and time.time() > publishing_ends + E2E_DRAIN_IDLE and (
                last is None or time.time() - last > E2E_DRAIN_IDLE
                or time.time() > publishing_ends + E2E_DRAIN_MAX):
            break
        if target is not None and received >= target:
            break
        try:
            fins = []
            for kind, data in conn.frames():
                if kind == 2:
                    now = time.time_ns()
                    received += 1
                    if args.mode == "e2e":
                        latencies.append((now - _stamp.unpack_from(data, 26)[0]) / 1e6)
                    fins.append(b"FIN " + data[10:26] + b"\n")
                elif data == b"_heartbeat_":
                    fins.append(b"NOP\n")
                elif kind == 1:
                    raise RuntimeError(data.decode())
            if fins:
                conn.sock.sendall(b"".join(fins))
                last = time.time()
                first = first or last
        except socket.timeout:
            if args.mode == "sub" and received and time.time() - last > 5:
                break
    results.put({"role": "consumer", "received": received, "first": first, "last": last,
                 "latencies": latencies, "cpu_s": time.process_time() - cpu})


def prefill(args):
    conn = Conn(args.host, args.port)
    conn.sock.sendall(b"SUB " + args.topic.encode() + b" " + args.channel.encode() + b"\n")
    conn.expect_ok()
    conn.sock.close()
    conn = Conn(args.host, args.port)
    topic = args.topic.encode()
    for i in range(0, args.messages, 100):
        n = min(100, args.messages - i)
        conn.sock.sendall(mpub_command(topic, [b"x" * args.size] * n))
        conn.expect_ok()


def percentile(sorted_values, q):
    if not sorted_values:
        return None
    return round(sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))], 3)


def run(args) -> dict:
    results = mp.Queue()
    start_at = time.time() + 1.0
    procs = []
    if args.mode == "sub":
        prefill(args)
        start_at = time.time() + 1.0
    if args.mode in ("sub", "e2e"):
        procs += [mp.Process(target=consumer, args=(args, i, start_at, results))
                  for i in range(args.consumers)]
    if args.mode in ("pub", "mpub", "e2e"):
        procs += [mp.Process(target=producer, args=(args, i, start_at, results))
                  for i in range(args.producers)]
    for p in procs:
        p.start()
    reports = [results.get(timeout=args.seconds + 120) for _ in procs]
    for p in procs:
        p.join(10)
    sent = sum(r.get("sent", 0) for r in reports)
    trips = sum(r.get("round_trips", 0) for r in reports)
    received = sum(r.get("received", 0) for r in reports)
    lasts = [r["last"] for r in reports
             if r["last"] and (r["role"] == "consumer" or args.mode != "e2e")]
    window_end = max(lasts) if lasts else start_at
    window = window_end - start_at
    out = {"mode": args.mode, "producers": args.producers, "consumers": args.consumers,
           "batch": args.batch, "rdy": args.rdy, "size": args.size, "rate": args.rate,
           "window_start": start_at, "window_end": window_end, "window_s": round(window, 3),
           "loadgen_cpu_pct": round(100 * sum(r["cpu_s"] for r in reports) / window)
           if window > 0 else None}
    if args.mode in ("pub", "mpub"):
        out.update(msgs_per_s=round(sent / window), round_trips_per_s=round(trips / window),
                   messages=sent)
    elif args.mode == "sub":
        out.update(messages=received, msgs_per_s=round(received / window) if window else 0)
    else:
        lat = sorted(x for r in reports for x in r.get("latencies", []))
        out.update(sent=sent, received=received,
                   msgs_per_s=round(received / window) if window > 0 else 0,
                   p50_ms=percentile(lat, 0.5), p99_ms=percentile(lat, 0.99),
                   max_ms=round(lat[-1], 3) if lat else None)
    return out


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["pub", "mpub", "sub", "e2e"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=4150)
    p.add_argument("--topic", default=f"bench-{os.getpid()}")
    p.add_argument("--channel", default="bench")
    p.add_argument("--producers", type=int, default=1)
    p.add_argument("--consumers", type=int, default=1)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--rdy", type=int, default=100)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--messages", type=int, default=100_000, help="sub mode: pre-filled count")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=0, help="total msgs/s, 0 = as fast as possible")
    p.add_argument("--keyed", action="store_true",
                   help="pub, mpub: a publish key per message (relay's IDENTIFY relay_dedup)")
    p.add_argument("--output-buffer-timeout", type=int, default=-1,
                   help="consumers' IDENTIFY output_buffer_timeout ms: -1 (default) writes "
                        "each delivery at once, 0 takes the broker's (nsqd: 250 ms)")
    args = p.parse_args(argv)
    if args.mode == "pub":
        args.batch = 1
    return args


if __name__ == "__main__":
    result = run(parse())
    print(json.dumps(result), flush=True)
    if result["mode"] == "e2e" and result["received"] != result["sent"]:
        print(f"loadgen: {result['sent'] - result['received']} of {result['sent']} messages "
              "published were not received", file=sys.stderr)
        sys.exit(1)
    sys.exit(0)
