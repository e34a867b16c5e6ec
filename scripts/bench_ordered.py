"""Ordered delivery by key (issue 48), its targets measured as ratios in one run.

Every measurement runs on a fresh scripts/bench.py Stack (an embedded Redis of
conf/redis.conf, one broker, one scanner); CPU is read from /proc for the broker, Redis
and the scanner every 0.1 s (bench.CpuSampler) and taken over the timed window only.

1. rate: N messages (--messages) over --keys order keys round-robin (message i has key
   i % keys), preloaded through HTTP /mpub?ordered=true ("KEY BODY" lines, --batch a
   POST), then consumed to empty by --consumers raw-socket consumers at --rdy that FIN
   each message at once. Variants, each on a stack of its own, alternately for --rounds:
   `ordered` (the channel ordered before the publish), `unordered` (the same keyed
   publish to a channel that is not ordered) and `plain` (nsqd's /mpub of the same
   bodies, no order keys: today's path). The window runs from the consumers' common RDY
   to the last message received. Reported: msgs/s, broker/Redis/scanner CPU µs per
   message over the window, Redis and broker µs per message of the preload (publish),
   and the paired ratios ordered / unordered (median over rounds of the same round's
   ratio). The consumers check the order: a message of a key received (timestamped
   before its FIN is sent) before an earlier-published one of the same key counts as an
   order violation (an unordered channel shows plenty; an ordered one must show none).
2. one key: --one-key-messages messages of one key on an ordered channel, same 4
   consumers at RDY 100: msgs/s and the round trip (the gap between one delivery of
   the key and the next: FIN, release, delivery), median and p99; beside the same
   count on a plain channel consumed by one consumer at RDY 1 (one message per round
   trip too, today's path).
3. idle: an ordered channel holding K keys (--idle-keys, e.g. 10 and 10,000) with two
   messages each, so one of each key is out and one waits behind it: `queued` (a
   consumer connected at RDY 0) and `in flight` (consumers at RDY 2,500 hold one of each
   key, not finished, msg_timeout 10 min). After --idle-warmup s, over --idle-seconds:
   Redis CPU (INFO used_cpu_user + sys), Redis commands/s, broker and scanner CPU.
4. memory: in one Redis, an unordered channel (the control), then an ordered one, then
   the ordered one again: Redis used_memory, used_memory_dataset and the sum of MEMORY
   USAGE of every key before (after a warm-up publish and drain on 10 keys), after
   publishing --memory-per-key messages to each of --memory-keys keys, and after
   consuming them all (2 s settled); the keys that changed, what is left under the
   ordered channel's gate, key_of and waiting, and the slowlog's length (its entries keep
   their arguments, in used_memory but in no key).

    .venv/bin/python scripts/bench_ordered.py [--messages 100000] [--rounds 3] [--json]
        [--only rate,onekey,idle,memory] [--rev REV | --source DIR] [--body-tail]
        [--profile DIR]

--body-tail puts what differs between bodies at their end (Lua 5.1 hashes a long string
by bytes read from its end: BENCHMARKS.md, issue 35). --profile DIR: after the rate
rounds, one more drain of each variant with py-spy recording the broker (raw stacks in
DIR, the top functions in the output; not in the figures).

--json prints the results as one JSON line after the tables. --pretend-unordered runs
everything with plain channels in place of ordered ones (to try the script on a broker
without ordered delivery; its figures mean nothing for issue 48).
"""

import argparse
import datetime
import http.client
import json
import math
import multiprocessing as mp
import os
import platform
import resource
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from relay.store.keys import ChannelKeys  # noqa: E402
from relay.store.ordering import WAITING_FIELD  # noqa: E402
from scripts import loadgen  # noqa: E402
from scripts.bench import CpuSampler, Stack, cpu_model, cpu_seconds  # noqa: E402
from scripts.compare import checked_out  # noqa: E402

TOPIC = "ordered-bench"
CHANNEL = "c"
MAX_RDY = 2500          # the broker's default max_rdy_count
IDLE_GIVE_UP = 15.0     # consumers stop when nothing came for this long
PRETEND = False         # --pretend-unordered
BODY_TAIL = False       # --body-tail


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


# -- the broker's HTTP API --------------------------------------------------------------

class Http:
    """One keep-alive HTTP connection to a broker."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method: str, path: str, body: bytes = b"", **args) -> bytes:
        query = urllib.parse.urlencode({k: v for k, v in args.items() if v is not None})
        self.conn.request(method, f"{path}?{query}" if query else path, body=body)
        reply = self.conn.getresponse()
        data = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"{method} {path} {args}: {reply.status} {data[:200]!r}")
        return data

    def close(self) -> None:
        self.conn.close()


def make_channel(api: Http, client: redis.Redis, topic: str, channel: str,
                 ordered: bool) -> None:
    """The topic and channel, the channel ordered (/channel/order) if `ordered`; checked
    in Redis: the channel meta's `ordered` field is 1 on an ordered channel only."""
    api.call("POST", "/topic/create", topic=topic)
    api.call("POST", "/channel/create", topic=topic, channel=channel)
    ordered = ordered and not PRETEND
    if ordered:
        api.call("POST", "/channel/order", topic=topic, channel=channel)
    meta = client.hget(f"relay:{{{topic}}}:ch:{channel}:meta", "ordered")
    if (meta == b"1") != ordered:
        raise RuntimeError(f"{topic}/{channel}: ordered {meta!r} in its meta, wanted "
                           f"{'1' if ordered else 'none'}")


def body_of(key: int, seq: int, size: int) -> bytes:
    """A message body that names its key and its place among the key's messages: at its
    head ("KEY SEQ xxx..."), or with --body-tail at its end ("xxx... KEY SEQ")."""
    if BODY_TAIL:
        tail = b" %d %d" % (key, seq)
        return b"x" * max(0, size - len(tail)) + tail
    head = b"%d %d " % (key, seq)
    return head + b"x" * max(0, size - len(head))


def key_seq(body: bytes) -> tuple[int, int]:
    if BODY_TAIL:
        _, key, seq = body.rsplit(b" ", 2)
    else:
        key, seq, _ = body.split(b" ", 2)
    return int(key), int(seq)


def order_key(key: int) -> bytes:
    return b"k%d" % key


def preload(api: Http, topic: str, messages: int, keys: int, size: int, keyed: bool,
            batch: int = 1000) -> None:
    """`messages` messages, message i of key i % keys (its seq i // keys), in /mpub calls
    of `batch` lines: "KEY BODY" with ordered=true when `keyed`, else the bare bodies."""
    keyed = keyed and not PRETEND
    for start in range(0, messages, batch):
        lines = []
        for i in range(start, min(messages, start + batch)):
            body = body_of(i % keys, i // keys, size)
            lines.append(order_key(i % keys) + b" " + body if keyed else body)
        api.call("POST", "/mpub", b"\n".join(lines) + b"\n", topic=topic,
                 ordered="true" if keyed else None)


def channel_stats(api: Http, topic: str, channel: str) -> dict:
    data = json.loads(api.call("GET", "/stats", format="json", topic=topic, channel=channel,
                               include_clients="false"))
    for t in data["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c
    return {}


# -- consumers --------------------------------------------------------------------------

def consume_one(port: int, topic: str, channel: str, rdy: int, total: int, counter,
                start_at: float, results) -> None:
    """One consumer (a process): SUB, RDY `rdy` at `start_at`, FIN each message at once,
    until `counter` (shared by all) reaches `total` or nothing came for IDLE_GIVE_UP s.
    Reports (key, seq, attempts, received ns) of every message, the stamp taken when its
    recv returned, before its FIN is sent."""
    conn = loadgen.Conn("127.0.0.1", port)
    conn.sock.sendall(loadgen.identify_command({"output_buffer_timeout": -1})
                      + b"SUB %s %s\n" % (topic.encode(), channel.encode()))
    conn.expect_ok(2)
    conn.sock.settimeout(0.1)
    records = []
    first = last = None
    while time.time() < start_at:
        time.sleep(0.0005)
    conn.sock.sendall(b"RDY %d\n" % rdy)
    cpu = time.process_time()
    waited_from = time.time()
    while counter.value < total:
        try:
            fins, now = [], None
            for kind, data in conn.frames():
                if now is None:
                    now = time.time_ns()
                if kind == 2:
                    key, seq = key_seq(data[26:])
                    records.append((key, seq, int.from_bytes(data[8:10], "big"), now))
                    fins.append(b"FIN " + data[10:26] + b"\n")
                elif data == b"_heartbeat_":
                    fins.append(b"NOP\n")
                elif kind == 1:
                    raise RuntimeError(data.decode())
            if fins:
                conn.sock.sendall(b"".join(fins))
                got = sum(f[0] == 70 for f in fins)     # b"F"
                if got:
                    with counter.get_lock():
                        counter.value += got
                    last = time.time()
                    first = first or last
                    waited_from = last
        except socket.timeout:
            if time.time() - waited_from > IDLE_GIVE_UP:
                break
    cpu = time.process_time() - cpu
    conn.sock.close()
    results.put({"records": records, "first": first, "last": last, "cpu_s": cpu})


def consume(port: int, topic: str, channel: str, total: int, consumers: int,
            rdy: int) -> dict:
    """`consumers` processes drain `total` messages; the window from their common RDY
    to the last message received, and every message's record."""
    counter = mp.Value("q", 0)
    results: mp.Queue = mp.Queue()
    start_at = time.time() + 1.0
    procs = [mp.Process(target=consume_one, args=(port, topic, channel, rdy, total, counter,
                                                  start_at, results))
             for _ in range(consumers)]
    for p in procs:
        p.start()
    reports = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(10)
    lasts = [r["last"] for r in reports if r["last"]]
    records = [x for r in reports for x in r["records"]]
    end = max(lasts) if lasts else start_at
    return {"window_start": start_at, "window_end": end, "window_s": end - start_at,
            "received": len(records), "records": records,
            "consumer_cpu_s": sum(r["cpu_s"] for r in reports),
            "per_consumer": [len(r["records"]) for r in reports]}


def order_check(records: list) -> dict:
    """Per key, the messages in order of receipt: how many came before an earlier-
    published one already received (violations), how many were received again
    (redeliveries), and the gaps between one delivery of a key and its next (ms)."""
    by_key: dict = {}
    for key, seq, attempts, at in records:
        by_key.setdefault(key, []).append((at, seq))
    violations = redeliveries = 0
    gaps = []
    for got in by_key.values():
        got.sort()
        seen, top = set(), -1
        for n, (at, seq) in enumerate(got):
            if seq in seen:
                redeliveries += 1
            elif seq < top:
                violations += 1
            seen.add(seq)
            top = max(top, seq)
            if n:
                gaps.append((at - got[n - 1][0]) / 1e6)
    gaps.sort()
    unique = len({(key, seq) for key, seq, _, _ in records})
    pick = lambda q: round(gaps[min(len(gaps) - 1, int(len(gaps) * q))], 3)  # noqa: E731
    return {"order_violations": violations, "redeliveries": redeliveries, "unique": unique,
            "key_gap_p50_ms": pick(0.5) if gaps else None,
            "key_gap_p99_ms": pick(0.99) if gaps else None}


# -- 1 and 2: consume rates -------------------------------------------------------------

VARIANTS = {"ordered": (True, True), "unordered": (False, True), "plain": (False, False)}


def redis_cpu(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"]


def commandstats(client: redis.Redis) -> dict:
    return {k.removeprefix("cmdstat_"): (v["calls"], v["usec"])
            for k, v in client.info("commandstats").items()}


def per_message(before: dict, after: dict, messages: int) -> dict:
    """Each Redis command's calls and µs per message between two commandstats (scripts'
    inner commands counted too, their time inside fcall's), the costliest first."""
    out = {}
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls > c0 and name != "info":
            out[name] = [round((calls - c0) / messages, 3), round((usec - u0) / messages, 2)]
    return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))


def py_spy(pid: int, path: str):
    """py-spy recording `pid` (raw, collapsed stacks) until stopped (SIGINT)."""
    binary = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    return subprocess.Popen([binary, "record", "--pid", str(pid), "--format", "raw",
                             "--rate", "250", "--output", path, "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def warm_up(stack: Stack, api: Http, client: redis.Redis, consumers: int, rdy: int) -> None:
    """2,000 plain messages through another topic first, so that the broker has made its
    Redis connections (each loads the scripts) before anything is timed."""
    make_channel(api, client, TOPIC + "-warm-up", CHANNEL, False)
    preload(api, TOPIC + "-warm-up", 2000, 10, 100, False)
    consume(stack.tcp_port, TOPIC + "-warm-up", CHANNEL, 2000, consumers, rdy)


def drain_run(variant: str, messages: int, keys: int, consumers: int, rdy: int, size: int,
              source: str | None, profile: str | None = None) -> dict:
    """One variant on a fresh stack: preload, then drain; rates, CPU and the order; with
    `profile` (a file name), py-spy records the broker over the drain."""
    ordered, keyed = VARIANTS[variant]
    stack = Stack(1, source)
    try:
        api = Http(stack.http_ports[0])
        client = redis.Redis.from_url(stack.url)
        warm_up(stack, api, client, consumers, rdy)
        make_channel(api, client, TOPIC, CHANNEL, ordered)
        broker_pids = stack.broker_pids()
        cpu0 = redis_cpu(client), sum(cpu_seconds(p) for p in broker_pids)
        t0 = time.time()
        preload(api, TOPIC, messages, keys, size, keyed)
        preload_s = time.time() - t0
        cpu1 = redis_cpu(client), sum(cpu_seconds(p) for p in broker_pids)
        before = channel_stats(api, TOPIC, CHANNEL)
        time.sleep(0.5)
        sampler = CpuSampler({"broker": broker_pids,
                              "redis": [p.pid for p in stack.redis_servers],
                              "scanner": [stack.scanner.pid]})
        spy = py_spy(broker_pids[0], profile) if profile else None
        stats0 = commandstats(client)
        out = consume(stack.tcp_port, TOPIC, CHANNEL, messages, consumers, rdy)
        stats1 = commandstats(client)
        if spy:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        time.sleep(0.2)
        sampler.stop()
        after = channel_stats(api, TOPIC, CHANNEL)
        api.close()
        start, end = sampler.at(out["window_start"]), sampler.at(out["window_end"])
        result = {"variant": variant, "messages": messages, "keys": keys,
                  "consumers": consumers, "rdy": rdy, "size": size,
                  "received": out["received"], "window_s": round(out["window_s"], 3),
                  "msgs_per_s": round(out["received"] / out["window_s"])
                  if out["window_s"] > 0 else 0,
                  "per_consumer": out["per_consumer"],
                  "depth_before": before.get("depth"), "depth_after": after.get("depth"),
                  "in_flight_after": after.get("in_flight_count"),
                  "preload_s": round(preload_s, 2),
                  "publish_redis_us_per_msg": round(1e6 * (cpu1[0] - cpu0[0]) / messages, 2),
                  "publish_broker_us_per_msg": round(1e6 * (cpu1[1] - cpu0[1]) / messages,
                                                     2),
                  "consumer_cpu_pct": round(100 * out["consumer_cpu_s"] / out["window_s"])
                  if out["window_s"] > 0 else None}
        for who in ("broker", "redis", "scanner"):
            used = end[who] - start[who]
            result[f"{who}_us_per_msg"] = round(1e6 * used / max(1, out["received"]), 2)
            result[f"{who}_cpu_pct"] = round(100 * used / out["window_s"]) \
                if out["window_s"] > 0 else None
        result["total_redis_us_per_msg"] = round(result["redis_us_per_msg"]
                                                 + result["publish_redis_us_per_msg"], 2)
        result["total_broker_us_per_msg"] = round(result["broker_us_per_msg"]
                                                  + result["publish_broker_us_per_msg"], 2)
        result.update(order_check(out["records"]))
        result["missing"] = messages - result.pop("unique")
        result["redis_commands_per_msg"] = per_message(stats0, stats1, max(1, out["received"]))
        return result
    finally:
        stack.stop()


def paired(results: dict, base: str, other: str, key: str) -> float | None:
    pairs = [o[key] / b[key] for b, o in zip(results[base], results[other]) if b[key]]
    return round(statistics.median(pairs), 3) if pairs else None


def rates(args) -> dict:
    variants = args.variants
    runs: dict = {v: [] for v in variants}
    for n in range(args.rounds):
        for v in variants:
            log(f"rate, round {n + 1}/{args.rounds}: {v}, {args.messages:,} messages over "
                f"{args.keys:,} keys")
            r = drain_run(v, args.messages, args.keys, args.consumers, args.rdy, args.size,
                          args.source)
            log("  " + json.dumps(r))
            runs[v].append(r)
    summary = {v: {k: statistics.median(r[k] for r in rs)
                   for k in ("msgs_per_s", "broker_us_per_msg", "redis_us_per_msg",
                             "scanner_us_per_msg", "publish_redis_us_per_msg",
                             "publish_broker_us_per_msg", "total_redis_us_per_msg",
                             "total_broker_us_per_msg")}
               for v, rs in runs.items()}
    ratios = {}
    for base in variants:
        if base == "ordered" or "ordered" not in variants:
            continue
        ratios[f"ordered/{base}"] = {
            k: paired(runs, base, "ordered", k)
            for k in ("msgs_per_s", "redis_us_per_msg", "broker_us_per_msg",
                      "publish_redis_us_per_msg", "publish_broker_us_per_msg",
                      "total_redis_us_per_msg", "total_broker_us_per_msg")}
    result = {"runs": runs, "median": summary, "ratios": ratios}
    if args.profile:
        result["profile"] = profiles(args)
    return result


def collapsed(path: str, top: int = 20) -> dict:
    """py-spy's raw output (one "frame;frame;... count" a line): the share of samples each
    function is on top of the stack (self) and anywhere in it (total), the top ones."""
    own: dict = {}
    total: dict = {}
    samples = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n = int(count)
            frames = [fr.rsplit(":", 1)[0] + ")" if fr.endswith(")") else fr
                      for fr in stack.split(";")]     # by function: the line numbers go
            samples += n
            own[frames[-1]] = own.get(frames[-1], 0) + n
            for fr in set(frames):
                total[fr] = total.get(fr, 0) + n
    pick = lambda d: {k: round(100 * v / samples, 1)  # noqa: E731
                      for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]}
    return {"samples": samples, "self_pct": pick(own), "total_pct": pick(total)}


def profiles(args) -> dict:
    """One more drain of each variant with py-spy on the broker (not in the figures)."""
    os.makedirs(args.profile, exist_ok=True)
    out = {}
    for v in args.variants:
        path = os.path.join(args.profile, f"broker-{v}.txt")
        log(f"profile: {v} -> {path}")
        r = drain_run(v, args.messages, args.keys, args.consumers, args.rdy, args.size,
                      args.source, profile=path)
        out[v] = {"msgs_per_s": r["msgs_per_s"], "file": path,
                  **(collapsed(path) if os.path.exists(path) else {"error": "no output"})}
    return out


def one_key(args) -> dict:
    """One key on an ordered channel (4 consumers, RDY 100), beside a plain channel
    drained by one consumer at RDY 1, alternately."""
    out: dict = {"ordered 1 key": [], "plain C=1 RDY 1": []}
    for n in range(args.rounds):
        log(f"one key, round {n + 1}/{args.rounds}")
        r = drain_run("ordered", args.one_key_messages, 1, args.consumers, args.rdy,
                      args.size, args.source)
        log("  " + json.dumps(r))
        out["ordered 1 key"].append(r)
        r = drain_run("plain", args.one_key_messages, 1, 1, 1, args.size, args.source)
        log("  " + json.dumps(r))
        out["plain C=1 RDY 1"].append(r)
    return {"runs": out,
            "median": {name: {k: statistics.median(r[k] for r in rs if r[k] is not None)
                              for k in ("msgs_per_s", "key_gap_p50_ms", "key_gap_p99_ms",
                                        "broker_us_per_msg", "redis_us_per_msg")}
                       for name, rs in out.items()},
            "ratio_msgs_per_s": paired(out, "plain C=1 RDY 1", "ordered 1 key",
                                       "msgs_per_s")}


# -- 3: idle cost -----------------------------------------------------------------------

def hold(port: int, topic: str, channel: str, keys: int, mode: str) -> list:
    """Consumers that hold the channel: one at RDY 0 (`queued`), or enough at RDY 2,500
    to take one message of each key and keep it (`in flight`, msg_timeout 10 min)."""
    count = 1 if mode == "queued" else math.ceil(keys / MAX_RDY)
    conns = []
    for i in range(count):
        conn = loadgen.Conn("127.0.0.1", port)
        conn.sock.sendall(loadgen.identify_command({"msg_timeout": 600_000,
                                                    "heartbeat_interval": 30_000})
                          + b"SUB %s %s\n" % (topic.encode(), channel.encode()))
        conn.expect_ok(2)
        conns.append(conn)
    if mode == "in flight":
        left = keys
        for conn in conns:
            conn.sock.sendall(b"RDY %d\n" % min(MAX_RDY, left))
            left -= min(MAX_RDY, left)
    return conns


def wait_idle(conns: list, seconds: float, expect: int = 0) -> int:
    """Answer heartbeats for `seconds` (or until `expect` messages came, if given);
    how many messages came."""
    selector = selectors.DefaultSelector()
    for conn in conns:
        conn.sock.settimeout(None)
        selector.register(conn.sock, selectors.EVENT_READ, conn)
    got = 0
    end = time.monotonic() + seconds
    try:
        while (left := end - time.monotonic()) > 0 and not (expect and got >= expect):
            for key, _ in selector.select(left):
                conn = key.data
                for kind, data in conn.frames():
                    if kind == 2:
                        got += 1
                    elif data == b"_heartbeat_":
                        conn.sock.sendall(b"NOP\n")
                    elif kind == 1:
                        raise RuntimeError(data.decode())
    finally:
        selector.close()
    return got


def idle_run(keys: int, mode: str, args) -> dict:
    stack = Stack(1, args.source)
    try:
        api = Http(stack.http_ports[0])
        client = redis.Redis.from_url(stack.url)
        make_channel(api, client, TOPIC, CHANNEL, True)
        conns = hold(stack.tcp_port, TOPIC, CHANNEL, keys, mode)
        preload(api, TOPIC, 2 * keys, keys, args.size, True)
        expect = keys if mode == "in flight" else 0
        got = wait_idle(conns, 120 if expect else 0.1, expect)
        if got < expect:
            raise RuntimeError(f"only {got} of {keys} messages in flight after 120 s")
        got += wait_idle(conns, args.idle_warmup)
        stats = channel_stats(api, TOPIC, CHANNEL)
        info0 = client.info("all")
        pids = {"broker": stack.broker_pids(), "scanner": [stack.scanner.pid]}
        cpu0 = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
        t0 = time.monotonic()
        late = wait_idle(conns, args.idle_seconds)
        elapsed = time.monotonic() - t0
        info1 = client.info("all")
        cpu1 = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
        infos = info1.get("cmdstat_info", {}).get("calls", 0) - \
            info0.get("cmdstat_info", {}).get("calls", 0)
        by_name = {k[8:]: round((v["calls"] - info0.get(k, {}).get("calls", 0)) / elapsed, 1)
                   for k, v in info1.items() if k.startswith("cmdstat_") and k != "cmdstat_info"}
        for conn in conns:
            conn.sock.close()
        api.close()
        return {"keys": keys, "mode": mode, "seconds": round(elapsed, 1),
                "depth": stats.get("depth"), "in_flight": stats.get("in_flight_count"),
                "held_by_consumers": got, "delivered_while_idle": late,
                "redis_cpu_pct": round(100 * (info1["used_cpu_user"] + info1["used_cpu_sys"]
                                              - info0["used_cpu_user"] - info0["used_cpu_sys"])
                                       / elapsed, 2),
                "redis_commands_per_s": round(
                    (info1["total_commands_processed"] - info0["total_commands_processed"]
                     - infos) / elapsed, 1),
                "commands_per_s_by_name": {k: v for k, v in sorted(by_name.items()) if v},
                **{f"{k}_cpu_pct": round(100 * (cpu1[k] - cpu0[k]) / elapsed, 2)
                   for k in pids},
                "redis_used_memory": info1["used_memory"]}
    finally:
        stack.stop()


def idle(args) -> dict:
    runs = []
    for mode in ("queued", "in flight"):
        for keys in args.idle_keys:
            log(f"idle: {keys:,} keys, {mode}")
            runs.append(idle_run(keys, mode, args))
            log("  " + json.dumps(runs[-1]))
    return {"runs": runs}


# -- 4: memory --------------------------------------------------------------------------

def memory_now(client: redis.Redis) -> dict:
    m = client.info("memory")
    return {"used_memory": m["used_memory"], "used_memory_dataset": m["used_memory_dataset"],
            "mem_clients_normal": m.get("mem_clients_normal"),
            "mem_aof_buffer": m.get("mem_aof_buffer"),
            "connected_clients": client.info("clients")["connected_clients"],
            "keys": client.dbsize(), "keys_bytes": sum(key_sizes(client).values()),
            "slowlog_len": client.slowlog_len(),
            **{k.replace(".", "_"): v for k, v in client.memory_stats().items()
               if k in ("overhead.total", "lua.caches")}}


def key_sizes(client: redis.Redis) -> dict:
    """MEMORY USAGE of every key (a bench's Redis holds a few dozen)."""
    return {k.decode(): client.memory_usage(k, samples=0) or 0 for k in client.scan_iter()}


def grown(before: dict, after: dict, least: int = 256) -> dict:
    """The keys whose bytes changed by `least` or more (new ones and gone ones too)."""
    out = {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}
    return {k: v for k, v in sorted(out.items(), key=lambda kv: -abs(kv[1]))
            if abs(v) >= least}


def order_keys(client: redis.Redis, topic: str, channel: str) -> dict:
    """What the channel's order keys hold (spec layout), and their bytes, with how many
    wait numbered in msgs (data layout 3)."""
    out = {}
    c = ChannelKeys.of(topic, channel)
    for key, suffix, count in ((c.gate, "gate", client.hlen), (c.key_of, "key_of", client.hlen),
                               (c.waiting, "waiting", client.zcard)):
        exists = client.exists(key)
        out[suffix] = {"entries": count(key) if exists else 0,
                       "bytes": client.memory_usage(key, samples=0) if exists else 0}
    out["numbered in msgs"] = {"entries": int(client.hget(c.meta, WAITING_FIELD) or 0),
                               "bytes": client.memory_usage(c.msgs, samples=0) or 0}
    return out


def memory_phase(stack: Stack, client: redis.Redis, topic: str, ordered: bool,
                 args) -> dict:
    api = Http(stack.http_ports[0])
    make_channel(api, client, topic, CHANNEL, ordered)
    # warm-up, as the run below on 10 keys: the paths run and the connections are made
    preload(api, topic, 2000, 10, args.size, True)
    consume(stack.tcp_port, topic, CHANNEL, 2000, args.consumers, args.rdy)
    time.sleep(2)
    base = memory_now(client)
    sizes = key_sizes(client)
    count = args.memory_keys * args.memory_per_key
    preload(api, topic, count, args.memory_keys, args.size, True)
    time.sleep(0.5)
    peak = memory_now(client)
    held = order_keys(client, topic, CHANNEL)
    drained = consume(stack.tcp_port, topic, CHANNEL, count, args.consumers, args.rdy)
    time.sleep(2)
    after = memory_now(client)
    changed = grown(sizes, key_sizes(client))
    left = order_keys(client, topic, CHANNEL)
    stats = channel_stats(api, topic, CHANNEL)
    api.close()
    return {"ordered": ordered, "keys": args.memory_keys, "per_key": args.memory_per_key,
            "messages": count, "received": drained["received"],
            "depth_after": stats.get("depth"), "in_flight_after": stats.get("in_flight_count"),
            "before": base, "published": peak, "consumed": after,
            "order_keys_published": held, "order_keys_consumed": left,
            "bytes_per_queued_message": round((peak["used_memory"] - base["used_memory"])
                                              / count),
            "left_bytes": after["used_memory"] - base["used_memory"],
            "left_dataset_bytes": after["used_memory_dataset"] - base["used_memory_dataset"],
            "left_keys": after["keys"] - base["keys"], "keys_changed": changed,
            "left_clients_bytes": (after["mem_clients_normal"] or 0)
            - (base["mem_clients_normal"] or 0),
            "left_keys_bytes": after["keys_bytes"] - base["keys_bytes"]}


def memory(args) -> dict:
    stack = Stack(1, args.source)
    try:
        client = redis.Redis.from_url(stack.url)
        out: dict = {}
        for name, topic, ordered in (("unordered", TOPIC + "-control", False),
                                     ("ordered", TOPIC, True),
                                     ("ordered, again", TOPIC, True)):
            log(f"memory: {args.memory_keys:,} keys x {args.memory_per_key}, {name}")
            out[name] = memory_phase(stack, client, topic, ordered, args)
            log("  " + json.dumps(out[name]))
        return {**out, "redis_version": client.info("server")["redis_version"]}
    finally:
        stack.stop()


# -- output -----------------------------------------------------------------------------

def table(header: list, rows: list) -> list:
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
            *["| " + " | ".join(str(c) for c in row) + " |" for row in rows]]


def render(results: dict, args) -> list:
    lines = [f"# bench_ordered {datetime.datetime.now().isoformat(timespec='seconds')}",
             f"Machine: {os.cpu_count()} cores, {platform.machine()}, {cpu_model()}, "
             f"Python {platform.python_version()}; brokers from {args.source or ROOT}; "
             f"bodies {'xxx... KEY SEQ' if BODY_TAIL else 'KEY SEQ xxx...'}"
             + (" (PRETEND: plain channels, not ordered)" if PRETEND else ""), ""]
    if "rate" in results:
        r = results["rate"]
        lines += [f"## Drain {args.messages:,} messages over {args.keys:,} keys, "
                  f"{args.consumers} consumers at RDY {args.rdy}, {args.size} B, "
                  f"{args.rounds} rounds (medians)", ""]
        rows = []
        for v, rs in r["runs"].items():
            m = r["median"][v]
            rows.append([v, " / ".join(f"{x['msgs_per_s']:,}" for x in rs),
                         f"{m['msgs_per_s']:,.0f}", f"{m['broker_us_per_msg']:.1f}",
                         f"{m['redis_us_per_msg']:.1f}", f"{m['scanner_us_per_msg']:.1f}",
                         f"{m['publish_broker_us_per_msg']:.1f}",
                         f"{m['publish_redis_us_per_msg']:.1f}",
                         "/".join(str(x["order_violations"]) for x in rs),
                         "/".join(str(x["redeliveries"]) for x in rs),
                         "/".join(str(x.get("missing", 0)) for x in rs)])
        lines += table(["variant", "msgs/s each round", "median msgs/s", "broker µs/msg",
                        "Redis µs/msg", "scanner µs/msg", "publish: broker µs/msg",
                        "publish: Redis µs/msg", "order violations", "redelivered",
                        "missing"], rows)
        lines.append("")
        for name, ratio in r["ratios"].items():
            lines.append(f"- {name} (paired, median over rounds): drain rate "
                         f"**{ratio['msgs_per_s']}x** (target >= 0.7); Redis µs/msg, drain "
                         f"**{ratio['redis_us_per_msg']}x** (target <= 1.5), publish "
                         f"{ratio['publish_redis_us_per_msg']}x, both "
                         f"**{ratio['total_redis_us_per_msg']}x**; broker µs/msg, drain "
                         f"{ratio['broker_us_per_msg']}x, publish "
                         f"{ratio['publish_broker_us_per_msg']}x, both "
                         f"{ratio['total_broker_us_per_msg']}x")
        lines.append("")
        last = {v: rs[-1]["redis_commands_per_msg"] for v, rs in r["runs"].items()}
        names = list(dict.fromkeys(n for v in last for n in list(last[v])[:8]))
        lines += ["Redis commands per message over the drain (last round; scripts' inner "
                  "commands counted too, their µs inside fcall's): calls / µs", ""]
        lines += table(["command", *last], [[n, *(" / ".join(map(str, last[v][n]))
                                                  if n in last[v] else "-" for v in last)]
                                             for n in names])
        lines.append("")
        for v, p in r.get("profile", {}).items():
            lines += [f"py-spy, broker, {v} ({p['msgs_per_s']:,} msgs/s with py-spy on, "
                      f"{p.get('samples', 0)} samples, {p['file']}): self % "
                      + ", ".join(f"{k} {x}" for k, x in list(p.get("self_pct", {}).items())
                                  [:12]), ""]
    if "onekey" in results:
        r = results["onekey"]
        lines += [f"## One key, {args.one_key_messages:,} messages (medians of "
                  f"{args.rounds})", ""]
        rows = []
        for name, m in r["median"].items():
            rows.append([name, " / ".join(f"{x['msgs_per_s']:,}" for x in r["runs"][name]),
                         f"{m['msgs_per_s']:,.0f}", f"{m['key_gap_p50_ms']:.3f}",
                         f"{m['key_gap_p99_ms']:.3f}", f"{m['broker_us_per_msg']:.1f}",
                         f"{m['redis_us_per_msg']:.1f}"])
        lines += table(["run", "msgs/s each round", "median msgs/s",
                        "round trip p50 ms", "p99 ms", "broker µs/msg", "Redis µs/msg"], rows)
        lines += ["", f"- ordered one key / plain C=1 RDY 1: {r['ratio_msgs_per_s']}x", ""]
    if "idle" in results:
        lines += [f"## Idle, two messages a key (one out, one waiting), "
                  f"{args.idle_seconds:g} s after {args.idle_warmup:g} s", ""]
        rows = [[f"{x['keys']:,}", x["mode"], x["depth"], x["in_flight"],
                 x["redis_cpu_pct"], x["redis_commands_per_s"], x["broker_cpu_pct"],
                 x["scanner_cpu_pct"], x["delivered_while_idle"],
                 f"{x['redis_used_memory'] / 2**20:.1f}"]
                for x in results["idle"]["runs"]]
        lines += table(["keys", "held", "depth", "in flight", "Redis CPU %",
                        "Redis commands/s", "broker CPU %", "scanner CPU %",
                        "delivered while idle", "Redis used MiB"], rows)
        lines.append("")
    if "memory" in results:
        r = results["memory"]
        lines += [f"## Redis memory, {args.memory_keys:,} keys x {args.memory_per_key} "
                  f"messages of {args.size} B, published then consumed (Redis "
                  f"{r['redis_version']})", ""]
        rows = []
        phases = [name for name in r if name != "redis_version"]
        for name in phases:
            x = r[name]
            rows.append([name, f"{x['before']['used_memory']:,}",
                         f"{x['published']['used_memory']:,}",
                         f"{x['consumed']['used_memory']:,}", f"{x['left_bytes']:+,}",
                         f"{x['left_dataset_bytes']:+,}", f"{x['left_keys_bytes']:+,}",
                         f"{x['left_clients_bytes']:+,}", f"{x['left_keys']:+}",
                         f"{x['left_bytes'] / x['keys']:+.1f}",
                         x["bytes_per_queued_message"], f"{x['received']:,}"])
        lines += table(["channel", "used_memory before", "published", "consumed",
                        "left", "left (dataset)", "left (sum of keys)", "left (clients)",
                        "left keys", "left B per order key", "bytes per queued msg",
                        "received"], rows)
        held, left = r["ordered"]["order_keys_published"], r["ordered"]["order_keys_consumed"]
        lines += ["", "- the ordered channel's order keys, published: " + ", ".join(
            f"{k} {v['entries']:,} entries {v['bytes']:,} B" for k, v in held.items()),
            "- after consuming: " + ", ".join(
                f"{k} {v['entries']:,} entries {v['bytes']:,} B" for k, v in left.items())]
        for name in phases:
            lines.append(f"- {name}: keys whose MEMORY USAGE changed by 256 B or more, "
                         "before -> consumed: " + (", ".join(
                             f"{k} {v:+,}" for k, v in r[name]["keys_changed"].items())
                             or "none"))
        lines.append("")
    return lines


def main() -> None:
    global PRETEND, BODY_TAIL
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--rdy", type=int, default=100)
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--body-tail", action="store_true",
                        help="the bytes that differ between bodies at their end, not their "
                             "head (Lua 5.1 hashes long strings by bytes read from the end)")
    parser.add_argument("--variants", default="ordered,unordered,plain",
                        help="of ordered, unordered (keyed publish), plain (no keys)")
    parser.add_argument("--one-key-messages", type=int, default=3000)
    parser.add_argument("--idle-keys", default="10,10000")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--idle-warmup", type=float, default=5.0)
    parser.add_argument("--memory-keys", type=int, default=10_000)
    parser.add_argument("--memory-per-key", type=int, default=2)
    parser.add_argument("--only", default="rate,onekey,idle,memory")
    parser.add_argument("--json", action="store_true", help="a JSON line after the tables")
    parser.add_argument("--profile", metavar="DIR",
                        help="after the rate rounds, one more drain of each variant with "
                             "py-spy on the broker (on PATH or beside the python), raw "
                             "stacks into DIR")
    parser.add_argument("--pretend-unordered", action="store_true",
                        help="plain channels in place of ordered ones (tries the script)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--rev", help="run the broker and scanner of this git revision")
    which.add_argument("--source", help="run the broker and scanner of this checkout")
    args = parser.parse_args()
    PRETEND = args.pretend_unordered
    BODY_TAIL = args.body_tail
    args.variants = [v for v in args.variants.split(",") if v]
    if unknown := set(args.variants) - set(VARIANTS):
        parser.error(f"unknown variants {unknown}")
    args.idle_keys = [int(k) for k in args.idle_keys.split(",")]
    parts = args.only.split(",")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    results: dict = {}
    command = " ".join([".venv/bin/python scripts/bench_ordered.py", *sys.argv[1:]])
    with checked_out(args.rev, "relay-bench-ordered-", args.source) as source:
        args.source = None if source == ROOT else source
        steps = {"rate": rates, "onekey": one_key, "idle": idle, "memory": memory}
        for part in parts:
            results[part] = steps[part](args)
    lines = render(results, args)
    lines.insert(1, f"`{command}`")
    print("\n".join(lines))
    if args.json:
        print(json.dumps({"command": command, "date": datetime.date.today().isoformat(),
                          "cpus": os.cpu_count(), "cpu_model": cpu_model(),
                          "pretend_unordered": PRETEND, **results}))


if __name__ == "__main__":
    main()
