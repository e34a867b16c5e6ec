"""Message priorities (issue 60 part 2), its targets measured on fresh stacks.

Every run is on a fresh scripts/bench.py Stack (an embedded Redis of conf/redis.conf,
one broker, one scanner), warmed up with 2,000 plain messages on another topic
(bench_ordered.warm_up); CPU is read from /proc for the broker and Redis every 0.1 s
(bench.CpuSampler) and taken over the timed window only, from the consumers' common RDY
to the last message received. Variants alternate within each of --rounds rounds.

1. order: the topic and channel created first, then --order-messages messages of
   priorities 0-9 (one tenth each) published in a random order, one HTTP /pub each on one
   keep-alive connection (priority=N; priority 0 every other time as priority=0, else
   without priority=),
   each body "PRIORITY SEQ xxx..." (SEQ: its place among its priority's publishes).
   Then ONE raw consumer at RDY 1 that FINs each message at once. Everything was
   published before it subscribed, so the priorities it receives (its ids' first digit)
   must never rise: a message received after one of a lower priority is a priority
   violation, one received before an earlier-published one of its priority a FIFO
   violation (target: none of either), an id whose digit is not its body's a mismatch.
2. cost: --messages messages of --size bytes preloaded through /mpub in --batch lines
   a call, then drained by --consumers raw consumers at --rdy that FIN at once; `plain`
   (no priority=) against `prioritized` (each batch at a random priority 1-9, so every
   message goes through the channel's urgent set). Reported: msgs/s, Redis and broker
   CPU µs per message over the drain, Redis and broker µs per message of the preload
   (publish), and the paired ratios prioritized / plain (median over rounds of the same
   round's ratio). Target: Redis µs per message (drain) with priorities <= 1.3x without.

    .venv/bin/python scripts/bench_priority.py [--messages 100000]
        [--order-messages 10000] [--rounds 2] [--only order,cost] [--json]

--json prints the results as one JSON line after the tables.
"""

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import random
import socket
import statistics
import sys
import time

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from scripts import loadgen  # noqa: E402
from scripts.bench import CpuSampler, Stack, cpu_model, cpu_seconds  # noqa: E402
from scripts.bench_ordered import (Http, channel_stats, log, paired, redis_cpu,  # noqa: E402
                                   table, warm_up)

TOPIC, CHANNEL = "t", "c"
IDLE_GIVE_UP = 15.0     # consumers stop when nothing came for this long
TARGET_RATIO = 1.3


def body_of(priority: int, seq: int, size: int) -> bytes:
    head = b"%d %d " % (priority, seq)
    return head + b"x" * max(0, size - len(head))


def publish_shuffled(api: Http, count: int, size: int, rng: random.Random) -> None:
    """`count` messages, priorities 0-9 a tenth each, one /pub each in a random order."""
    seqs = [0] * 10
    order = [i % 10 for i in range(count)]
    rng.shuffle(order)
    for priority in order:
        seq = seqs[priority]
        seqs[priority] += 1
        given = str(priority) if priority or seq % 2 else None
        api.call("POST", "/pub", body_of(priority, seq, size), topic=TOPIC, priority=given)


def publish_batches(api: Http, count: int, size: int, batch: int, prioritized: bool,
                    rng: random.Random) -> None:
    """`count` messages in /mpub calls of `batch` lines, each call at a random priority
    1-9 if `prioritized`, else without priority=."""
    for start in range(0, count, batch):
        priority = rng.randint(1, 9) if prioritized else 0
        lines = [body_of(priority, i, size) for i in range(start, min(count, start + batch))]
        api.call("POST", "/mpub", b"\n".join(lines) + b"\n", topic=TOPIC,
                 priority=str(priority) if prioritized else None)


def consume_one(port: int, rdy: int, total: int, counter, start_at: float, results) -> None:
    """One consumer (a process): SUB, RDY `rdy` at `start_at`, FIN each message at once
    until `counter` (shared) reaches `total` or nothing came for IDLE_GIVE_UP s. Reports
    (id priority, body priority, seq, attempts) of each message in the order received."""
    conn = loadgen.Conn("127.0.0.1", port)
    conn.sock.sendall(loadgen.identify_command({"output_buffer_timeout": -1})
                      + b"SUB %s %s\n" % (TOPIC.encode(), CHANNEL.encode()))
    conn.expect_ok(2)
    conn.sock.settimeout(0.1)
    records, last = [], None
    while time.time() < start_at:
        time.sleep(0.0005)
    conn.sock.sendall(b"RDY %d\n" % rdy)
    waited_from = time.time()
    while counter.value < total:
        try:
            out = []
            for kind, data in conn.frames():
                if kind == 2:
                    priority, seq, _ = data[26:].split(b" ", 2)
                    records.append((int(data[10:11], 16), int(priority), int(seq),
                                    int.from_bytes(data[8:10], "big")))
                    out.append(b"FIN " + data[10:26] + b"\n")
                elif data == b"_heartbeat_":
                    out.append(b"NOP\n")
                elif kind == 1:
                    raise RuntimeError(data.decode())
            if out:
                conn.sock.sendall(b"".join(out))
                got = sum(x[0] == 70 for x in out)     # b"F"
                if got:
                    with counter.get_lock():
                        counter.value += got
                    last = waited_from = time.time()
        except socket.timeout:
            if time.time() - waited_from > IDLE_GIVE_UP:
                break
    conn.sock.close()
    results.put({"records": records, "last": last})


def consume(port: int, total: int, consumers: int, rdy: int) -> dict:
    counter, results = mp.Value("q", 0), mp.Queue()
    start_at = time.time() + 1.0
    procs = [mp.Process(target=consume_one, args=(port, rdy, total, counter, start_at,
                                                  results)) for _ in range(consumers)]
    for p in procs:
        p.start()
    reports = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(10)
    lasts = [r["last"] for r in reports if r["last"]]
    return {"start": start_at, "end": max(lasts) if lasts else start_at,
            "records": [x for r in reports for x in r["records"]],
            "per_consumer": [len(r["records"]) for r in reports]}


def check(records: list, total: int, in_order: bool) -> dict:
    """Ids whose digit is not their body's priority, redeliveries and missing messages;
    with `in_order` (one consumer's records as received) the priority and FIFO
    violations and the priorities in the order they first came."""
    unique = {(p, seq) for _, p, seq, _ in records}
    out = {"mismatched": sum(i != p for i, p, _, _ in records),
           "redelivered": len(records) - len(unique), "missing": total - len(unique)}
    if in_order:
        lowest, top, came = 10, {}, []
        prio_v = fifo_v = 0
        for prio, _, seq, _ in records:
            prio_v += prio > lowest
            lowest = min(lowest, prio)
            fifo_v += seq < top.get(prio, -1)
            top[prio] = max(top.get(prio, -1), seq)
            if not came or came[-1] != prio:
                came.append(prio)
        out.update(priority_violations=prio_v, fifo_violations=fifo_v,
                   priorities_as_received=came[:20])
    return out


def run(variant: str, args, rng: random.Random) -> dict:
    """One variant on a fresh stack: publish, then drain; rates, CPU and the checks."""
    ordering = variant == "order"
    count = args.order_messages if ordering else args.messages
    consumers, rdy = (1, 1) if ordering else (args.consumers, args.rdy)
    stack = Stack(1)
    try:
        api = Http(stack.http_ports[0])
        client = redis.Redis.from_url(stack.url)
        info = client.info("server")
        server = f"{info['server_name']} {info['valkey_version']}" \
            if "valkey_version" in info else f"redis {info['redis_version']}"
        warm_up(stack, api, client, args.consumers, args.rdy)
        api.call("POST", "/topic/create", topic=TOPIC)
        api.call("POST", "/channel/create", topic=TOPIC, channel=CHANNEL)
        brokers = stack.broker_pids()
        cpu0 = redis_cpu(client), sum(cpu_seconds(p) for p in brokers)
        t0 = time.time()
        if ordering:
            publish_shuffled(api, count, args.size, rng)
        else:
            publish_batches(api, count, args.size, args.batch, variant == "prioritized", rng)
        publish_s = time.time() - t0
        cpu1 = redis_cpu(client), sum(cpu_seconds(p) for p in brokers)
        before = channel_stats(api, TOPIC, CHANNEL)
        time.sleep(0.5)
        sampler = CpuSampler({"broker": brokers, "redis": [p.pid for p in stack.redis_servers]})
        out = consume(stack.tcp_port, count, consumers, rdy)
        time.sleep(0.2)
        sampler.stop()
        after = channel_stats(api, TOPIC, CHANNEL)
        api.close()
        window = out["end"] - out["start"]
        got = len(out["records"])
        start, end = sampler.at(out["start"]), sampler.at(out["end"])
        result = {"variant": variant, "messages": count, "consumers": consumers, "rdy": rdy,
                  "received": got, "window_s": round(window, 3),
                  "msgs_per_s": round(got / window) if window > 0 else 0,
                  "per_consumer": out["per_consumer"], "publish_s": round(publish_s, 2),
                  "publish_redis_us_per_msg": round(1e6 * (cpu1[0] - cpu0[0]) / count, 2),
                  "publish_broker_us_per_msg": round(1e6 * (cpu1[1] - cpu0[1]) / count, 2),
                  "depth_before": before.get("depth"), "depth_after": after.get("depth"),
                  "in_flight_after": after.get("in_flight_count"), "server": server}
        for who in ("broker", "redis"):
            result[f"{who}_us_per_msg"] = round(1e6 * (end[who] - start[who]) / max(1, got), 2)
        result.update(check(out["records"], count, ordering))
        return result
    finally:
        stack.stop()


COST_KEYS = ("msgs_per_s", "redis_us_per_msg", "broker_us_per_msg",
             "publish_redis_us_per_msg", "publish_broker_us_per_msg")


def render(results: dict, args) -> list:
    runs = results["runs"]
    lines = [f"# bench_priority {datetime.datetime.now().isoformat(timespec='seconds')}",
             f"Machine: {os.cpu_count()} cores, {platform.machine()}, {cpu_model()}, "
             f"Python {platform.python_version()}, embedded {results['server']}", ""]
    if "order" in runs:
        lines += [f"## order: {args.order_messages:,} messages of priorities 0-9 published "
                  "in a random order, one consumer at RDY 1", ""]
        lines += table(["round", "msgs/s", "priority violations", "FIFO violations",
                        "id/body mismatched", "redelivered", "missing", "broker µs/msg",
                        "Redis µs/msg", "publish s"],
                       [[n + 1, f"{r['msgs_per_s']:,}", r["priority_violations"],
                         r["fifo_violations"], r["mismatched"], r["redelivered"],
                         r["missing"], r["broker_us_per_msg"], r["redis_us_per_msg"],
                         r["publish_s"]] for n, r in enumerate(runs["order"])])
        lines += ["", "- priorities as first received (first round): "
                  + " ".join(map(str, runs["order"][0]["priorities_as_received"])), ""]
    if "plain" in runs:
        lines += [f"## cost: drain {args.messages:,} messages of {args.size} B, "
                  f"{args.consumers} consumers at RDY {args.rdy}, /mpub of {args.batch}", ""]
        lines += table(["variant", "round", "msgs/s", "Redis µs/msg", "broker µs/msg",
                        "publish: Redis µs/msg", "publish: broker µs/msg", "mismatched",
                        "redelivered", "missing"],
                       [[v, n + 1, f"{r['msgs_per_s']:,}", r["redis_us_per_msg"],
                         r["broker_us_per_msg"], r["publish_redis_us_per_msg"],
                         r["publish_broker_us_per_msg"], r["mismatched"], r["redelivered"],
                         r["missing"]]
                        for v in ("plain", "prioritized") for n, r in enumerate(runs[v])])
        ratio = results["ratios"]
        met = ratio["redis_us_per_msg"] <= TARGET_RATIO
        lines += ["", "prioritized / plain, paired (median over rounds): "
                  + ", ".join(f"{k} {ratio[k]}x" for k in COST_KEYS),
                  f"- target Redis µs/msg (drain) <= {TARGET_RATIO}x: "
                  f"{ratio['redis_us_per_msg']}x, {'met' if met else 'NOT met'}", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--order-messages", type=int, default=10_000)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--rdy", type=int, default=100)
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--batch", type=int, default=1000, help="lines an /mpub")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=60)
    parser.add_argument("--only", default="order,cost")
    parser.add_argument("--json", action="store_true", help="a JSON line after the tables")
    args = parser.parse_args()
    parts = args.only.split(",")
    variants = (["order"] if "order" in parts else []) \
        + (["plain", "prioritized"] if "cost" in parts else [])
    rng = random.Random(args.seed)
    runs: dict = {v: [] for v in variants}
    for n in range(args.rounds):
        for v in variants:
            log(f"round {n + 1}/{args.rounds}: {v}")
            runs[v].append(run(v, args, rng))
            log("  " + json.dumps(runs[v][-1]))
    results = {"runs": runs, "server": next(iter(runs.values()))[0]["server"]}
    if "plain" in runs:
        results["ratios"] = {k: paired(runs, "plain", "prioritized", k) for k in COST_KEYS}
        results["medians"] = {v: {k: round(statistics.median(r[k] for r in runs[v]), 2)
                                  for k in COST_KEYS} for v in ("plain", "prioritized")}
    command = " ".join([".venv/bin/python scripts/bench_priority.py", *sys.argv[1:]])
    lines = render(results, args)
    lines.insert(1, f"`{command}`")
    print("\n".join(lines))
    if args.json:
        print(json.dumps({"command": command, "date": datetime.date.today().isoformat(),
                          "cpus": os.cpu_count(), "cpu_model": cpu_model(), **results}))


if __name__ == "__main__":
    main()
