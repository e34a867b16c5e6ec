"""relay beside nsqd v1.3.0 (../shared/bin/nsq-1.3.0) under nsq's own Go clients, in one
run: each workload --runs rounds, each round relay then nsqd (the order reversed every
other round), each on a fresh broker (a fresh Stack: embedded Redis, one broker, a
scanner; a fresh nsqd in a temporary folder), --seconds each. Reports the rate the client
reports, the CPU per message of the broker (relay: its processes, workers included;
nsqd: its process) and of Redis (relay only), read from /proc every 0.1 s over the
client's run (its process' start to end; rdy1: the counted window), and the ratio of
the rate to nsqd's in the same round (median over rounds). With --before REV, relay at
git revision REV too (a temporary worktree), so before, after and nsqd in one run.

Workloads (-size 200, topic t, channel c; PORT the broker's TCP port, N --seconds):

    pub1    GOMAXPROCS=16 bench_writer -nsqd-tcp-address 127.0.0.1:PORT -topic t
                -runfor Ns -size 200 -batch-size 1    (16 producers, one message a PUB)
    pub200  GOMAXPROCS=2 bench_writer ... -runfor Ns -size 200 -batch-size 200
    rdy1    channel c made (a SUB), the topic prefilled with
                GOMAXPROCS=2 bench_writer ... -runfor 3s -size 200 -batch-size 200,
            then 4 of  nsq_tail -nsqd-tcp-address 127.0.0.1:PORT -topic t -channel c
                -max-in-flight 1    (go-nsq's Consumer at RDY 1, one connection each)
            counted over N s after 0.5 s of warm-up (their output is 201 bytes a message).
            Not bench_reader -rdy 1: v1.3.0's bench_reader (one connection per GOMAXPROCS)
            flushes its FINs only once msgCount % rdy > 0.75 * rdy, which never happens
            below -rdy 5, so at RDY 1 it gets one message per connection and stalls.
    http1   wrk -t2 -c16 -d Ns -s POST.lua http://127.0.0.1:HTTP/pub?topic=t  (keep-alive,
                a body of 200 B a request; wrk from Debian's package, a tool for measuring
                only); the rate is wrk's requests/s, and a run with non-2xx answers fails
    sub2500 channel c made, the topic prefilled with
                GOMAXPROCS=2 bench_writer ... -runfor Ms -size 200 -batch-size 200
            (M = 1.5 N, so a reader as fast as nsqd's does not run dry), then
                GOMAXPROCS=2 bench_reader ... -channel c -runfor Ns -size 200 -rdy 2500
            alone: what consuming costs (deliver and finish), the reader's rate reported.
    sub100  the same with -rdy 100.
    e2e     channel c made, then at once
                GOMAXPROCS=2 bench_reader ... -channel c -runfor Ns -size 200 -rdy 2500
                GOMAXPROCS=2 bench_writer ... -runfor Ns -size 200 -batch-size 200
            the reader's rate reported.

Messages = rate x --seconds (rdy1: the count). --workers N is the relay broker's --workers.
--write FILE puts one table of every workload, relay beside nsqd, with the ceilings of
relay's scripts and of plain Redis (scripts/ceiling.py, as scripts/bench.py measures them),
at the top of FILE (BENCHMARKS.md), in place of the one an earlier --write put there.

    .venv/bin/python -m scripts.nsq_bench [--workloads pub1 pub200 rdy1 http1 e2e] [--runs 3]
        [--seconds 5] [--before REV] [--workers 1] [--json] [--write BENCHMARKS.md]
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

from relay import embedded
from scripts.bench import CURRENT_BEGIN, CURRENT_END, CpuSampler, Stack, ceilings, cpu_model
from scripts.bench_stats import Nsqd
from scripts.compare import checked_out
from scripts.loadgen import Conn

BIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
                   "shared", "bin", "nsq-1.3.0")
TOPIC, CHANNEL, SIZE = "t", "c", 200
PREFILL_S, WARMUP_S, TAILS = 3, 0.5, 4


def client(tool: str, port: int, gomaxprocs: int, seconds: float, *flags: str):
    return subprocess.Popen(
        [os.path.join(BIN, tool), "-nsqd-tcp-address", f"127.0.0.1:{port}", "-topic", TOPIC,
         "-runfor", f"{seconds:g}s", "-size", str(SIZE), *flags],
        env={**os.environ, "GOMAXPROCS": str(gomaxprocs)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)


def ops(proc) -> float:
    """The ops/s a bench client printed once it ends."""
    out = proc.communicate(timeout=120)[0]
    found = re.search(r"([\d.]+)ops/s", out)
    if proc.returncode or not found:
        raise RuntimeError(f"{proc.args[0]} failed: {out.strip()}")
    return float(found.group(1))


def make_channel(port: int) -> None:
    conn = Conn("127.0.0.1", port)
    conn.sock.sendall(f"SUB {TOPIC} {CHANNEL}\n".encode())
    conn.expect_ok()
    conn.sock.close()


def writer(gomaxprocs: int, batch: int):
    def run(broker, seconds: float) -> tuple:
        start = time.time()
        rate = ops(client("bench_writer", broker.tcp_port, gomaxprocs, seconds, "-batch-size",
                          str(batch)))
        return rate, rate * seconds, start, time.time()
    return run


def rdy1(broker, seconds: float) -> tuple:
    port = broker.tcp_port
    make_channel(port)
    filled = ops(client("bench_writer", port, 2, PREFILL_S, "-batch-size", "200")) * PREFILL_S
    outs = [tempfile.TemporaryFile() for _ in range(TAILS)]
    tails = [subprocess.Popen(
        [os.path.join(BIN, "nsq_tail"), "-nsqd-tcp-address", f"127.0.0.1:{port}", "-topic",
         TOPIC, "-channel", CHANNEL, "-max-in-flight", "1"], stdout=out,
        stderr=subprocess.DEVNULL) for out in outs]

    def received() -> int:
        return sum(os.fstat(out.fileno()).st_size for out in outs) // (SIZE + 1)
    try:
        time.sleep(WARMUP_S)
        start, first = time.time(), received()
        time.sleep(seconds)
        end, last = time.time(), received()
    finally:
        for tail in tails:
            tail.terminate()
        for tail in tails:
            tail.wait(10)
        for out in outs:
            out.close()
    if last > 0.9 * filled:
        print(f"rdy1: {last:,} of ~{filled:,.0f} prefilled messages consumed; the rate may "
              "be the prefill's", file=sys.stderr)
    return (last - first) / (end - start), last - first, start, end


WRK_POST = 'wrk.method = "POST"\nwrk.body = string.rep("x", %d)\n' % SIZE


def http1(broker, seconds: float) -> tuple:
    """wrk's POSTs to /pub, 16 connections kept alive; non-2xx answers fail the round."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(WRK_POST)
        script.flush()
        start = time.time()
        out = subprocess.run(
            ["wrk", "-t2", "-c16", f"-d{max(1, round(seconds))}s", "-s", script.name,
             f"http://127.0.0.1:{broker.http_ports[0]}/pub?topic={TOPIC}"],
            capture_output=True, text=True, timeout=seconds + 60).stdout
        end = time.time()
    found = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not found or "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk failed or had errors: {out.strip()}")
    rate = float(found.group(1))
    return rate, rate * seconds, start, end


def e2e(broker, seconds: float) -> tuple:
    port = broker.tcp_port
    make_channel(port)
    start = time.time()
    reader = client("bench_reader", port, 2, seconds, "-channel", CHANNEL, "-rdy", "2500")
    publisher = client("bench_writer", port, 2, seconds, "-batch-size", "200")
    ops(publisher)
    rate = ops(reader)
    return rate, rate * seconds, start, time.time()


def reader(rdy: int):
    def run(broker, seconds: float) -> tuple:
        port = broker.tcp_port
        make_channel(port)
        ops(client("bench_writer", port, 2, 1.5 * seconds, "-batch-size", "200"))
        start = time.time()
        rate = ops(client("bench_reader", port, 2, seconds, "-channel", CHANNEL, "-rdy",
                          str(rdy)))
        return rate, rate * seconds, start, time.time()
    return run


WORKLOADS = {"pub1": writer(16, 1), "pub200": writer(2, 200), "rdy1": rdy1, "http1": http1,
             "e2e": e2e, "sub2500": reader(2500), "sub100": reader(100)}


def one_round(workload: str, source: str | None, args) -> dict:
    """`workload` once on a fresh nsqd (source "nsqd") or Stack of relay from `source`."""
    if source == "nsqd":
        broker = Nsqd()
        pids = {"broker": [broker.proc.pid]}
    else:
        broker = Stack(1, source=source, workers=args.workers)
        pids = {"broker": broker.broker_pids(), "redis": [broker.redis_servers[0].pid]}
    try:
        sampler = CpuSampler(pids)
        try:
            rate, messages, start, end = WORKLOADS[workload](broker, args.seconds)
        finally:
            sampler.stop()
        before, after = sampler.at(start), sampler.at(end)
        result = {"msgs_per_s": round(rate), "window_s": round(end - start, 2)}
        for k in ("broker", "redis"):
            result[f"{k}_us_per_msg"] = (round(1e6 * (after[k] - before[k]) / messages, 1)
                                         if k in pids and messages else None)
        return result
    finally:
        broker.stop()


def medians(rounds: dict) -> dict:
    """Per target: the median of each figure, and of its rate / nsqd's in the same round."""
    out = {}
    for target, runs in rounds.items():
        out[target] = {k: round(statistics.median(r[k] for r in runs), 1)
                       if runs[0][k] is not None else None
                       for k in ("msgs_per_s", "broker_us_per_msg", "redis_us_per_msg")}
        out[target]["vs_nsqd"] = round(statistics.median(
            r["msgs_per_s"] / n["msgs_per_s"] for r, n in zip(runs, rounds["nsqd"])), 3)
    return out


def table(workload: str, summary: dict) -> str:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)
    lines = [f"### {workload}", "", "| target | msgs/s | broker µs/msg | redis µs/msg | "
             "msgs/s vs nsqd |", "| --- | --- | --- | --- | --- |"]
    for target, m in summary.items():
        lines.append(f"| {target} | {m['msgs_per_s']:,.0f} | {fmt(m['broker_us_per_msg'], '.1f')}"
                     f" | {fmt(m['redis_us_per_msg'], '.1f')} | {m['vs_nsqd']:.2f} |")
    return "\n".join(lines)


CLIENTS = {"pub1": "`bench_writer -batch-size 1`, 16 producers",
           "pub200": "`bench_writer -batch-size 200`, 2 producers",
           "rdy1": "4 `nsq_tail -max-in-flight 1`",
           "http1": "`wrk -t2 -c16` POST 200 B to `/pub`, keep-alive",
           "e2e": "`bench_writer` 200 + `bench_reader` RDY 2500",
           "sub2500": "`bench_reader` RDY 2500 alone, on a prefilled topic",
           "sub100": "`bench_reader` RDY 100 alone, on a prefilled topic"}


def server_version() -> str:
    """The embedded server's name and version, as it says them (e.g. "Valkey 8.1.8")."""
    said = subprocess.run([embedded.server_binary(), "--version"], capture_output=True,
                          text=True).stdout
    found = re.search(r"^(\w+) server v=(\S+)", said)
    return f"{found.group(1).capitalize()} {found.group(2)}" if found else "server"


def current_table(summary: dict, ceiling: dict, args) -> str:
    """The table --write puts at the top of BENCHMARKS.md."""
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    left_out = [w for w in WORKLOADS if w not in args.workloads]
    chosen = f"--workloads {' '.join(args.workloads)} " if left_out else ""
    command = (f".venv/bin/python -m scripts.nsq_bench {chosen}--runs {args.runs} "
               f"--seconds {args.seconds:g} --write {args.write}")
    lines = [CURRENT_BEGIN, "", "## Now: relay beside nsqd v1.3.0", "",
             f"`{command}`, on {revision}, {datetime.date.today().isoformat()}: "
             f"{os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}. "
             f"Medians of {args.runs} alternating rounds of {args.seconds:g} s, each on a "
             f"fresh broker (relay: one broker, a scanner, the embedded {server_version()} "
             "with conf/redis.conf); µs/msg is CPU time per message, which holds on any "
             "host." + (f" Not measured in this run: {', '.join(left_out)}." if left_out
                        else ""), "",
             "| workload (nsq's clients) | relay msgs/s | nsqd msgs/s | relay / nsqd "
             "| relay broker µs/msg | nsqd µs/msg | relay Redis µs/msg |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for workload, m in summary.items():
        relay, nsqd = m["relay"], m["nsqd"]
        lines.append(f"| {workload}: {CLIENTS[workload]} | {relay['msgs_per_s']:,.0f} | "
                     f"{nsqd['msgs_per_s']:,.0f} | {relay['vs_nsqd']:.2f} | "
                     f"{relay['broker_us_per_msg']:.1f} | {nsqd['broker_us_per_msg']:.1f} | "
                     f"{relay['redis_us_per_msg']:.1f} |")
    lines += ["", "Ceilings in the same run (scripts/ceiling.py, 200 B, batches of 100 from "
              "one process): relay's scripts / plain Redis lists, msgs/s: " + "; ".join(
                  f"{work} {ceiling[('scripts', work)]:,} / {ceiling[('plain', work)]:,}"
                  for work in ("publish", "consume", "loop")) + ".", "", CURRENT_END]
    return "\n".join(lines)


def write(path: str, block: str) -> None:
    """`block` in place of the one between the markers in the file, or after its title."""
    with open(path) as f:
        text = f.read()
    if CURRENT_BEGIN in text:
        head, _, rest = text.partition(CURRENT_BEGIN)
        text = head + block + rest.partition(CURRENT_END)[2]
    else:
        title, _, rest = text.partition("\n")
        text = f"{title}\n\n{block}\n{rest}"
    with open(path, "w") as f:
        f.write(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS),
                        default=list(WORKLOADS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--before", help="a git revision of relay to measure too")
    parser.add_argument("--workers", type=int, default=1, help="the relay broker's --workers")
    parser.add_argument("--json", action="store_true", help="everything as JSON instead")
    parser.add_argument("--write", metavar="FILE", help="the table at the top of FILE")
    args = parser.parse_args()
    if args.write and args.before:
        parser.error("--write puts this checkout beside nsqd: not with --before")
    with checked_out(args.before, "relay-nsq-bench-") as before:
        targets = ({f"before {args.before}": before, "after": None} if args.before
                   else {"relay": None})
        targets["nsqd"] = "nsqd"
        results = {}
        for workload in args.workloads:
            rounds = results[workload] = {target: [] for target in targets}
            for i in range(args.runs):
                for target in list(targets)[::-1 if i % 2 else 1]:
                    rounds[target].append(one_round(workload, targets[target], args))
                    if not args.json:
                        r = rounds[target][-1]
                        print(f"{workload} round {i + 1} {target}: {r['msgs_per_s']:,} msgs/s,"
                              f" broker {r['broker_us_per_msg']} µs/msg, redis "
                              f"{r['redis_us_per_msg'] or '-'} µs/msg over {r['window_s']} s",
                              flush=True)
    summary = {workload: medians(rounds) for workload, rounds in results.items()}
    if args.json:
        print(json.dumps({"args": vars(args), "rounds": results, "medians": summary}, indent=1))
        return
    for workload in results:
        print()
        print(table(workload, summary[workload]))
    if args.write:
        write(args.write, current_table(summary, ceilings(args.seconds), args))
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
