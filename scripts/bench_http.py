"""HTTP publishing over keep-alive connections: `wrk -t2 -c16` POSTing 200 B to /pub, and
one http.client connection's answer times, against one broker; with --before, against a
git revision's broker too, run alternately so both see the same machine. Reports
requests/s, non-2xx answers, and the broker's and Redis's CPU per request.

    .venv/bin/python -m scripts.bench_http [--before REV] [--runs 3] [--seconds 5]

Needs wrk (Debian: apt-get install wrk).
"""

import argparse
import http.client
import re
import statistics
import subprocess
import tempfile
import time

from scripts.bench import Stack, cpu_seconds
from scripts.compare import checked_out

POST = 'wrk.method = "POST"\nwrk.body = string.rep("x", 200)\n'


def keep_alive_ms(http_port: int, count: int = 20) -> float:
    """The median answer time of `count` POSTs to /pub on one keep-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
    times = []
    for _ in range(count + 1):
        started = time.perf_counter()
        conn.request("POST", "/pub?topic=ka", b"x" * 200)
        conn.getresponse().read()
        times.append(time.perf_counter() - started)
    conn.close()
    return round(1000 * statistics.median(times[1:]), 2)


def wrk(http_port: int, seconds: int, script: str) -> dict:
    """wrk's figures, with the broker's and Redis's CPU per request over its run."""
    out = subprocess.run(["wrk", "-t2", "-c16", f"-d{seconds}s", "-s", script,
                          f"http://127.0.0.1:{http_port}/pub?topic=bench"],
                         capture_output=True, text=True, check=True).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {"req_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "requests": requests, "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
            "socket_errors": errors.group(1).strip() if errors else ""}


def run(source: str | None, seconds: int, script: str) -> dict:
    stack = Stack(1, source)
    try:
        http_port = stack.http_ports[0]
        result = {"keep_alive_ms": keep_alive_ms(http_port)}
        pids = {"broker": stack.broker_pids(), "redis": [p.pid for p in stack.redis_servers]}
        before = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
        result.update(wrk(http_port, seconds, script))
        for k, v in pids.items():
            used = sum(cpu_seconds(p) for p in v) - before[k]
            result[f"{k}_us_per_req"] = round(1e6 * used / max(result["requests"], 1), 1)
        return result
    finally:
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="a git revision to measure alternately")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script, \
            checked_out(args.before, "relay-bench-http-") as before:
        script.write(POST)
        script.flush()
        sources = {"this checkout": None, **({args.before: before} if args.before else {})}
        results: dict = {name: [] for name in sources}
        for _ in range(args.runs):
            for name, source in sources.items():
                results[name].append(run(source, args.seconds, script.name))
    columns = ["keep_alive_ms", "req_per_s", "non_2xx", "socket_errors", "broker_us_per_req",
               "redis_us_per_req"]
    print("| broker | " + " | ".join(columns) + " |")
    print("|" + " --- |" * (len(columns) + 1))
    for name, runs in results.items():
        for r in runs:
            print(f"| {name} | " + " | ".join(str(r[c]) for c in columns) + " |")
        medians = ["" if c == "socket_errors" else str(statistics.median(r[c] for r in runs))
                   for c in columns]
        print(f"| {name}, median | " + " | ".join(medians) + " |")


if __name__ == "__main__":
    main()
