"""Run every benchmark workload and regenerate BENCHMARKS.md.

Each workload runs --runs times against a fresh embedded Redis (conf/redis.conf:
AOF everysec) and fresh broker processes; the ceiling and plain-Redis baselines
(scripts/ceiling.py) are measured in the same run, so ratios survive a noisy,
shared machine; each workload is compared with the ceiling for the same work. CPU is
read from /proc for the broker(s) and Redis every 0.1 s and taken over the load
generator's timed window only (its window_start .. window_end).

    .venv/bin/python scripts/bench.py [--runs 3] [--seconds 5] [--out BENCHMARKS.md]
        [--only TITLE-PART] [--scanner-args "--messages 100000 ..."]
"""

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from relay import embedded  # noqa: E402
from scripts import ceiling, loadgen  # noqa: E402

LOADGEN = os.path.join(HERE, "loadgen.py")
SCANNER_SCALE = os.path.join(HERE, "scanner_scale.py")
NOTES_MARKER = "<!-- everything below is written by hand and kept by scripts/bench.py -->"
# around the table of relay beside nsqd that scripts/nsq_bench.py --write puts on top
CURRENT_BEGIN = "<!-- written by scripts/nsq_bench.py --write: begin -->"
CURRENT_END = "<!-- written by scripts/nsq_bench.py --write: end -->"
TICK = os.sysconf("SC_CLK_TCK")
# which ceiling does the same work as a loadgen mode
WORK = {"pub": "publish", "mpub": "publish", "sub": "consume", "e2e": "loop"}

# (title, loadgen args, brokers)
WORKLOADS = [
    ("pub P=1, 100 B", ["pub", "--producers", "1", "--size", "100"], 1),
    ("pub P=4, 100 B", ["pub", "--producers", "4", "--size", "100"], 1),
    ("pub P=16, 100 B", ["pub", "--producers", "16", "--size", "100"], 1),
    ("mpub K=100 P=1, 100 B", ["mpub", "--producers", "1", "--batch", "100", "--size", "100"], 1),
    ("mpub K=100 P=2, 100 B", ["mpub", "--producers", "2", "--batch", "100", "--size", "100"], 1),
    ("mpub K=100 P=1, 1 KiB", ["mpub", "--producers", "1", "--batch", "100", "--size", "1024"], 1),
    ("mpub K=100 P=2, 1 KiB", ["mpub", "--producers", "2", "--batch", "100", "--size", "1024"], 1),
    ("sub C=1 RDY 1", ["sub", "--consumers", "1", "--rdy", "1", "--messages", "20000"], 1),
    ("sub C=4 RDY 1", ["sub", "--consumers", "4", "--rdy", "1", "--messages", "40000"], 1),
    ("sub C=1 RDY 100", ["sub", "--consumers", "1", "--rdy", "100", "--messages", "200000"], 1),
    ("sub C=1 RDY 2500, nsqd's output buffering, 200 B",
     ["sub", "--consumers", "1", "--rdy", "2500", "--messages", "300000", "--size", "200",
      "--output-buffer-timeout", "0"], 1),
    ("sub C=4 RDY 100", ["sub", "--consumers", "4", "--rdy", "100", "--messages", "200000"], 1),
    ("e2e 1x100 -> 4 consumers RDY 100, 200 B",
     ["e2e", "--producers", "1", "--batch", "100", "--consumers", "4", "--rdy", "100",
      "--size", "200"], 1),
    ("e2e 2 producers, 1 broker",
     ["e2e", "--producers", "2", "--batch", "100", "--consumers", "4", "--rdy", "100",
      "--size", "200"], 1),
    ("e2e as above, 2 brokers",
     ["e2e", "--producers", "2", "--batch", "100", "--consumers", "4", "--rdy", "100",
      "--size", "200"], 2),
    ("e2e fixed 10,000 msgs/s, 200 B",
     ["e2e", "--producers", "1", "--batch", "10", "--consumers", "4", "--rdy", "100",
      "--size", "200", "--rate", "10000"], 1),
]


@contextmanager
def own_redis(name: str) -> Iterator[str]:
    """The URL of an embedded Redis of conf/redis.conf, the bench's own, in a temporary
    folder: the server stopped and the folder gone after."""
    port = embedded.free_port()
    folder = tempfile.mkdtemp(prefix=f"relay-bench-{name}-")
    server = embedded.start(port, folder, os.path.join(ROOT, "conf", "redis.conf"))
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(folder, ignore_errors=True)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Stack:
    """An embedded Redis (or a local cluster) and N brokers sharing one TCP port
    (SO_REUSEPORT), each on an HTTP port of its own."""

    def __init__(self, brokers: int, source: str | None = None, workers: int = 1,
                 cluster: int = 0, broker_args: tuple = (), log_level: str | None = None):
        """`source`: a checkout whose relay the brokers and scanner run (default: this one);
        `workers`: each broker's --workers; `cluster`: a local cluster of that many
        masters with a replica each instead of one Redis (both with conf/redis.conf);
        `broker_args`: more options for the brokers; `log_level`: the brokers log at
        this level into files of their own (log_size), instead of warnings to stderr."""
        self.dir = tempfile.mkdtemp(prefix="relay-bench-")
        conf = os.path.join(ROOT, "conf", "redis.conf")
        if cluster:
            first = embedded.free_ports(2 * cluster)
            self.redis_ports = list(range(first, first + 2 * cluster))
            self.redis_servers = embedded.start_cluster(self.redis_ports, self.dir, conf=conf,
                                                        replicas=1)
        else:
            self.redis_ports = [embedded.free_port()]
            self.redis_servers = [embedded.start(self.redis_ports[0], self.dir, conf)]
        self.url = f"redis://127.0.0.1:{self.redis_ports[0]}/0"
        self.tcp_port = embedded.free_port()
        self.http_ports = [embedded.free_port() for _ in range(brokers)]
        env = {**os.environ, "REDIS_URL": self.url, "RELAY_LOG_LEVEL": "warning"}
        self.logs = [open(os.path.join(self.dir, f"broker-{i}.log"), "wb") if log_level
                     else None for i in range(brokers)]
        if source:
            env["PYTHONPATH"] = source
        self.brokers = [subprocess.Popen(
            [sys.executable, "-m", "relay", "broker", "--tcp-address",
             f"127.0.0.1:{self.tcp_port}", "--http-address", f"127.0.0.1:{http}",
             *(["--workers", str(workers)] if workers > 1 else []), *broker_args,
             *(["--log-level", log_level] if log_level else [])],
            env=env, cwd=self.dir, stderr=log)
            for http, log in zip(self.http_ports, self.logs)]
        self.scanner = subprocess.Popen([sys.executable, "-m", "relay", "scanner"], env=env,
                                        cwd=self.dir)
        for proc, http in zip(self.brokers, self.http_ports):
            embedded.wait_for_port("127.0.0.1", http, proc)
        embedded.wait_for_port("127.0.0.1", self.tcp_port, self.brokers[0])
        if workers > 1:
            self._wait_for_workers(brokers * workers)

    def _wait_for_workers(self, count: int) -> None:
        """Until `count` brokers are registered (each worker registers once it listens)."""
        deadline = time.monotonic() + 30
        while redis.Redis.from_url(self.url).zcard("relay:brokers") < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {count} brokers registered after 30 s")
            time.sleep(0.1)

    def log_size(self, index: int) -> int:
        """How many bytes broker `index` has logged (with a log_level)."""
        return os.path.getsize(os.path.join(self.dir, f"broker-{index}.log"))

    def broker_pids(self) -> list[int]:
        """The broker processes and, with --workers, their workers (what CPU counts)."""
        pids = [p.pid for p in self.brokers]
        for pid in list(pids):
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                pids += [int(child) for child in f.read().split()]
        return pids

    def http(self, index: int, path: str) -> bytes:
        url = f"http://127.0.0.1:{self.http_ports[index]}{path}"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.read()

    def connections(self, index: int) -> int:
        """Producers and consumers connected to one broker now (its /stats)."""
        stats = json.loads(self.http(index, "/stats?format=json"))
        return len(stats["producers"]) + sum(len(c["clients"]) for t in stats["topics"]
                                             for c in t["channels"])

    def counters(self, index: int) -> dict:
        """This broker's published and delivered message counters (its /metrics)."""
        text = self.http(index, "/metrics").decode()
        return {name: int(float(re.search(rf"^relay_{name}_messages_total (\S+)$", text,
                                          re.M).group(1)))
                for name in ("published", "delivered")}

    def calls(self) -> Counter:
        """Calls so far of each command (lower case), summed over the Redis servers."""
        total = Counter()
        for port in self.redis_ports:
            stats = redis.Redis(port=port).info("commandstats")
            total.update({name.removeprefix("cmdstat_"): value["calls"]
                          for name, value in stats.items()})
        return total

    def stop(self):
        """Brokers and scanner first, so they leave their registries while Redis runs;
        then Redis's data goes (a run of MPUBs leaves hundreds of MB of AOF)."""
        for group in (self.brokers + [self.scanner], self.redis_servers):
            for p in group:
                p.terminate()
            for p in group:
                p.wait(10)
        for log in self.logs:
            if log:
                log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class CpuSampler:
    """CPU seconds of groups of processes every 0.1 s, to read over any window later."""

    def __init__(self, pids: dict):
        self.pids, self.samples, self.running = pids, [], True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while self.running:
            self.samples.append((time.time(), {k: sum(cpu_seconds(p) for p in v)
                                               for k, v in self.pids.items()}))
            time.sleep(0.1)

    def stop(self):
        self.running = False
        self.thread.join()

    def at(self, when: float) -> dict:
        """CPU seconds per group at wall time `when`, interpolated between samples."""
        before = max((s for s in self.samples if s[0] <= when), default=self.samples[0],
                     key=lambda s: s[0])
        after = min((s for s in self.samples if s[0] >= when), default=self.samples[-1],
                    key=lambda s: s[0])
        if after[0] == before[0]:
            return before[1]
        f = (when - before[0]) / (after[0] - before[0])
        return {k: before[1][k] + f * (after[1][k] - before[1][k]) for k in before[1]}


def run_workload(args: list, brokers: int, seconds: float, source: str | None = None,
                 workers: int = 1, prepare=None, **stack_args) -> dict:
    """One loadgen run on a fresh Stack (`stack_args`: Stack's cluster, broker_args);
    `prepare(stack)`, if given, runs before the load (e.g. to set a channel's controls)."""
    stack = Stack(brokers, source, workers, **stack_args)
    try:
        if prepare:
            prepare(stack)
        pids = {"broker": stack.broker_pids(), "redis": [p.pid for p in stack.redis_servers]}
        sampler = CpuSampler(pids)
        proc = subprocess.Popen([sys.executable, LOADGEN, *args, "--port", str(stack.tcp_port),
                                 "--seconds", str(seconds)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        connections = None
        if brokers > 1:     # mid-run, while every connection is open
            time.sleep(1.0 + seconds / 2)
            connections = [stack.connections(i) for i in range(brokers)]
        stdout, stderr = proc.communicate(timeout=300)
        sampler.stop()
        if proc.returncode:
            raise RuntimeError(f"loadgen {' '.join(args)} failed: {stderr.strip()}")
        result = json.loads(stdout.strip().splitlines()[-1])
        start, end = sampler.at(result["window_start"]), sampler.at(result["window_end"])
        messages = result["msgs_per_s"] * result["window_s"]
        for k in pids:
            result[f"{k}_cpu_pct"] = round(100 * (end[k] - start[k]) / result["window_s"])
            result[f"{k}_us_per_msg"] = round(1e6 * (end[k] - start[k]) / messages, 2)
        result["redis_calls"] = stack.calls()
        if brokers > 1:
            result["per_broker"] = {"connections": connections,
                                    **{k: [stack.counters(i)[k] for i in range(brokers)]
                                       for k in ("published", "delivered")}}
        return result
    finally:
        stack.stop()


def alternately(args: list, brokers: int, seconds: float, runs: int,
                settings: dict) -> dict:
    """run_workload with each of `settings` (name -> run_workload's keyword arguments)
    in turn, `runs` rounds (a, b, a, b ...), so all see the same machine: each setting's
    results, in order."""
    results = {name: [] for name in settings}
    for _ in range(runs):
        for name, kwargs in settings.items():
            results[name].append(run_workload(args, brokers, seconds, **kwargs))
    return results


def settings_table(description: str, columns: list[str], settings: dict, row) -> None:
    """The command line of a script that runs the one-broker workloads with each of
    `settings` alternately: a Markdown table of `columns`, row(title, results) each."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", action="append", default=[],
                        help="workloads whose title contains this (repeatable)")
    args = parser.parse_args()
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    for title, loadgen_args, brokers in WORKLOADS:
        if brokers != 1 or (args.only and not any(o in title for o in args.only)):
            continue
        results = alternately(loadgen_args, 1, args.seconds, args.runs, settings)
        print(row(title, results), flush=True)


def paired_ratio(results: dict, base, other, key: str = "msgs_per_s") -> float:
    """The median over rounds of `other`'s `key` / `base`'s in the same round."""
    return statistics.median(o[key] / b[key] for b, o in zip(results[base], results[other]))


def memory_per_message(count: int = 1_000_000, size: int = 200) -> dict:
    """Redis bytes per queued message and broker RSS before/after, the messages
    published through the broker (MPUB of 100) to one channel nobody consumes."""
    stack = Stack(1)
    try:
        client = redis.Redis.from_url(stack.url)
        conn = loadgen.Conn("127.0.0.1", stack.tcp_port)
        conn.sock.sendall(b"SUB memory c\n")
        conn.expect_ok()
        rss = lambda: int(open(f"/proc/{stack.brokers[0].pid}/status").read()  # noqa: E731
                          .split("VmRSS:")[1].split()[0]) * 1024
        rss_before = rss()
        used_before = client.info("memory")["used_memory"]
        producer = loadgen.Conn("127.0.0.1", stack.tcp_port)
        for i in range(0, count, 100):
            producer.sock.sendall(loadgen.mpub_command(b"memory", [b"x" * size] *
                                                       min(100, count - i)))
            producer.expect_ok()
        depth = json.loads(stack.http(0, "/stats?format=json&topic=memory"))["topics"][0][
            "channels"][0]["depth"]
        used_after = client.info("memory")["used_memory"]
        return {"messages": count, "size": size, "queued": depth,
                "bytes_per_message": round((used_after - used_before) / count),
                "broker_rss_before_mb": round(rss_before / 2**20, 1),
                "broker_rss_after_mb": round(rss() / 2**20, 1),
                "redis_version": client.info("server")["redis_version"]}
    finally:
        stack.stop()


def ceilings(seconds: float) -> dict:
    stack = Stack(1)
    try:
        return {(m["ceiling"], m["work"]): m["msgs_per_s"]
                for m in ceiling.measure(stack.url, seconds, 200)}
    finally:
        stack.stop()


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def scanner_scale(args: list) -> dict:
    """scripts/scanner_scale.py's JSON line; it starts its own Redis and scanner."""
    out = subprocess.run([sys.executable, SCANNER_SCALE, *args], capture_output=True,
                         text=True, check=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def render_scanner(scan: dict, args: list) -> list:
    command = " ".join(["scripts/scanner_scale.py", *args])
    return [
        "## Scanner at scale", "",
        f"`.venv/bin/python {command}`: {scan['topics']:,} topics x "
        f"{scan['channels'] // scan['topics']:,} channels = {scan['channels']:,} channels, "
        f"{scan['messages']:,} messages of {scan['size']} B put in flight through relay's "
        f"scripts in {scan['fill_s']} s, one `relay scanner` (queue_scan_interval "
        f"{scan['scan_interval_ms']} ms, queue_scan_limit {scan['scan_limit']}). Lateness is "
        "from a message's deadline to the wake-up that scan.lua publishes when it is back "
        "in its queue; CPU is percent of one core.", "",
        "| measure | result |", "| --- | --- |",
        f"| requeue lateness, deadlines uniform over {scan['window_s']:g} s in batches of "
        f"{scan['batch']} ({scan['messages'] / scan['window_s']:,.0f} msgs/s) "
        f"| p50 {scan['lateness_p50_ms']:.0f} ms, p99 {scan['lateness_p99_ms']:.0f} ms, "
        f"max {scan['lateness_max_ms']:.0f} ms |",
        f"| requeued (timeout_count) | {scan['requeued']:,} of {scan['messages']:,}, "
        f"{scan['in_flight_left']:,} left in flight |",
        f"| scanner / Redis CPU while requeueing | {scan['scanner_window_cpu_pct']:.1f} / "
        f"{scan['redis_window_cpu_pct']:.1f} |",
        f"| idle, {scan['idle_in_flight']:,} in flight due in 1 h: scanner / Redis CPU over "
        f"{scan['idle_seconds']:g} s | {scan['scanner_idle_cpu_pct']:.1f} / "
        f"{scan['redis_idle_cpu_pct']:.1f} |", "",
    ]


def render(results, ceil, memory, idle, scan, scan_args, runs, seconds) -> str:
    lines = [
        "# Benchmarks", "",
        f"Generated by `.venv/bin/python scripts/bench.py --runs {runs} --seconds {seconds:g}` "
        f"on {datetime.date.today().isoformat()}.",
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, {cpu_model()}, "
        f"Python {platform.python_version()}, embedded redis-server "
        f"{memory['redis_version']} (as the server reports it) with "
        "conf/redis.conf (AOF everysec). Broker, Redis and the load generator share the cores; "
        "the machine is shared and noisy, so read the ratios.", "",
        "## Ceilings, same run", "",
        "`scripts/ceiling.py`: relay's Lua scripts driven from one Python process in batches "
        "of 100, and a plain Redis list baseline (RPUSH/LPOP), 200 B, for each kind of work: "
        "publish only (pub and mpub rows), deliver + finish from a filled channel (sub rows), "
        "and publish -> deliver -> finish (e2e rows).", "",
        "| work | relay scripts msgs/s | plain Redis msgs/s |", "| --- | --- | --- |",
        *[f"| {work} | {ceil[('scripts', work)]:,} | {ceil[('plain', work)]:,} |"
          for work in ("publish", "consume", "loop")], "",
        "## Workloads", "",
        f"Medians of {runs} runs of {seconds:g} s each (`scripts/loadgen.py`), with min and max. "
        "Rates and CPU cover the load generator's timed window only (from the common start to "
        "the last publish, or to the last message received for sub and e2e; connecting, the "
        "sub prefill and the e2e drain wait are outside it). Ratios are median / the ceiling "
        "for the same work (the `work` column). e2e rows count sent and received messages; a "
        "run that loses one fails. CPU is percent of one core; µs/msg is CPU time over the "
        "window divided by the messages in it (for sub and e2e rows: delivered and finished, "
        "e2e also published), so it says how many cores a rate needs on any machine.", "",
        "| workload | median msgs/s | min | max | messages | work | x scripts ceiling "
        "| x plain | p99 ms | broker µs/msg | Redis µs/msg | broker CPU % | Redis CPU % "
        "| loadgen CPU % | loadgen args |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
        "| --- |",
    ]
    shares = []
    for title, args, brokers, runs_out in results:
        rates = [r["msgs_per_s"] for r in runs_out]
        med = statistics.median(rates)
        work = WORK[args[0]]
        p99 = statistics.median([r["p99_ms"] for r in runs_out]) if "p99_ms" in runs_out[0] \
            else ""
        messages = (f"{statistics.median(r['sent'] for r in runs_out):,.0f} sent = received"
                    if "sent" in runs_out[0] else
                    f"{statistics.median(r['messages'] for r in runs_out):,.0f}")
        bcpu = statistics.median(r["broker_cpu_pct"] for r in runs_out)
        rcpu = statistics.median(r["redis_cpu_pct"] for r in runs_out)
        lcpu = statistics.median(r["loadgen_cpu_pct"] for r in runs_out)
        bus = statistics.median(r["broker_us_per_msg"] for r in runs_out)
        rus = statistics.median(r["redis_us_per_msg"] for r in runs_out)
        lines.append(
            f"| {title} | {med:,.0f} | {min(rates):,} | {max(rates):,} | {messages} | {work} | "
            f"{med / ceil[('scripts', work)]:.2f} | {med / ceil[('plain', work)]:.2f} | {p99} | "
            f"{bus:.1f} | {rus:.1f} | {bcpu:.0f} | {rcpu:.0f} | {lcpu:.0f} | "
            f"`{' '.join(args)}`{f' ({brokers} brokers)' if brokers > 1 else ''} |")
        for n, r in enumerate(runs_out, 1):
            if "per_broker" in r:
                b = r["per_broker"]
                shares.append(f"- {title}, run {n}: connections "
                              f"{' / '.join(map(str, b['connections']))}, published "
                              f"{' / '.join(f'{x:,}' for x in b['published'])}, delivered "
                              f"{' / '.join(f'{x:,}' for x in b['delivered'])}")
    if shares:
        lines += ["", "Each broker's share (the kernel spreads connections to the shared "
                  "port; connections from /stats mid-run, messages from /metrics):", "",
                  *shares]
    lines += [
        "", "## Memory", "",
        f"{memory['messages']:,} messages of {memory['size']} B published through the broker "
        f"(MPUB of 100) into one channel with a consumer at RDY 0 ({memory['queued']:,} "
        f"queued after): **{memory['bytes_per_message']} bytes of Redis memory per message** "
        f"(INFO memory used_memory delta). Broker RSS {memory['broker_rss_before_mb']} MB "
        f"before, {memory['broker_rss_after_mb']} MB after.", "",
        "## Idle consumer latency", "",
        "`scripts/idle_latency.py`: one idle consumer (RDY 1), a PUB every 20 ms, time from "
        f"PUB to the message frame: p50 {idle['p50_ms']} ms, p99 {idle['p99_ms']} ms, "
        f"max {idle['max_ms']} ms over {idle['deliveries']} samples.", "",
    ]
    return "\n".join(lines + render_scanner(scan, scan_args))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    parser.add_argument("--only", default=None, help="run workloads whose title contains this")
    parser.add_argument("--memory-messages", type=int, default=1_000_000)
    parser.add_argument("--idle-samples", type=int, default=200)
    parser.add_argument("--scanner-args", default="",
                        help="arguments for scripts/scanner_scale.py (default: full scale)")
    args = parser.parse_args()
    ceil = ceilings(args.seconds)
    print(json.dumps({"ceilings": {f"{k} {w}": v for (k, w), v in ceil.items()}}), flush=True)
    results = []
    for title, wargs, brokers in WORKLOADS:
        if args.only and args.only not in title:
            continue
        runs = []
        for _ in range(args.runs):
            runs.append(run_workload(wargs, brokers, args.seconds))
            print(json.dumps({"workload": title, **runs[-1]}), flush=True)
        results.append((title, wargs, brokers, runs))
    memory = memory_per_message(args.memory_messages)
    print(json.dumps({"memory": memory}), flush=True)
    idle = json.loads(subprocess.run([sys.executable, os.path.join(HERE, "idle_latency.py"),
                                      "--samples", str(args.idle_samples),
                                      "--idle-seconds", "1"],
                                     capture_output=True, text=True, check=True,
                                     timeout=300).stdout.strip().splitlines()[-1])
    scan_args = shlex.split(args.scanner_args)
    scan = scanner_scale(scan_args)
    print(json.dumps({"scanner_scale": scan}), flush=True)
    notes, current = "", ""
    if os.path.exists(args.out):
        with open(args.out) as f:
            text = f.read()
        notes = text.partition(NOTES_MARKER)[2]
        if CURRENT_BEGIN in text:     # the table relay beside nsqd stays on top
            current = CURRENT_BEGIN + text.partition(CURRENT_BEGIN)[2].partition(
                CURRENT_END)[0] + CURRENT_END
    title, _, rest = render(results, ceil, memory, idle, scan, scan_args, args.runs,
                            args.seconds).partition("\n")
    with open(args.out, "w") as f:
        f.write(f"{title}\n\n{current}\n{rest}" if current else f"{title}\n{rest}")
        f.write("\n" + NOTES_MARKER + notes)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
