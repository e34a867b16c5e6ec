"""Throughput of relay's scripts on Redis Cluster with 1, 2 and 3 masters, for a
workload spread over many topics (issue 9), with a one-node Redis as the baseline
measured in the same run.

Each of --processes load processes owns --topics / processes topics (one channel
each) and loops: one pipeline of publish calls (--batch messages to each of its
topics), one of deliver calls, one of finish calls, as brokers' group commits send
them; on a cluster redis-py splits each pipeline per node. Reports messages through
the whole life cycle per second, and each Redis process' CPU (% of one core).
With --partitions N each topic has N parts (issue 19): publishes take them in turn,
and each process asks every part for `batch` messages per round. With fewer topics
than processes, every process loads every topic.

    .venv/bin/python scripts/cluster_scale.py [--masters 1,2,3] [--processes 2]
        [--topics 240] [--partitions 1] [--prefix scale] [--batch 10] [--seconds 10]
        [--runs 3]
"""

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from relay import embedded  # noqa: E402
from relay.codec import record_id  # noqa: E402
from relay.store import Store  # noqa: E402
from relay.store.connection import connect  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def load(url: str, topics: list, partitions: int, batch: int, start_at: float,
         seconds: float, out) -> None:
    store = Store(connect(url))
    body, owner = b"x" * 200, f"bench:{os.getpid()}"
    for topic in topics:
        store.control.set_partitions(topic, partitions)
        store.control.create_channel(topic, "c")
    parts = [part for topic in topics for part in store.parts(topic)]
    done = 0
    while time.time() < start_at:
        time.sleep(0.001)
    end = start_at + seconds
    while time.time() < end:
        store.run_many([store.publish_op(t, [body] * batch) for t in topics])
        delivered = store.run_many([store.deliver_op(p, "c", [(owner, 60_000, batch)])
                                    for p in parts])
        store.run_many([store.finish_op(p, "c", [(owner, record_id(r)) for r in got[0]])
                        for p, got in zip(parts, delivered) if got[0]])
        done += sum(len(got[0]) for got in delivered)
    out.put(done)


def run(url: str, pids: list, args) -> dict:
    topics = [f"{args.prefix}-{i}" for i in range(args.topics)]
    share = [topics[i::args.processes] if len(topics) >= args.processes else topics
             for i in range(args.processes)]
    out = mp.Queue()
    start_at = time.time() + 2.0
    procs = [mp.Process(target=load, args=(url, mine, args.partitions, args.batch, start_at,
                                           args.seconds, out))
             for mine in share]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.time()))
    before = [cpu_seconds(pid) for pid in pids]
    done = sum(out.get() for _ in procs)
    after = [cpu_seconds(pid) for pid in pids]
    for p in procs:
        p.join()
    return {"msgs_per_s": round(done / args.seconds),
            "redis_cpu": [round(100 * (a - b) / args.seconds) for a, b in zip(after, before)]}


def deployment(masters: int, data: str):
    """(url, server processes): masters 0 is a one-node server, not a cluster; all run
    the same Valkey binary."""
    ports = [embedded.free_port() for _ in range(max(masters, 1))]
    extra = ("--save", "", "--appendonly", "yes", "--appendfsync", "everysec")
    if masters == 0:
        proc = embedded.start(ports[0], data, extra=extra)
        return f"redis://127.0.0.1:{ports[0]}/0", [proc]
    return f"redis://127.0.0.1:{ports[0]}/0", embedded.start_cluster(ports, data, extra)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--masters", default="1,2,3")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--topics", type=int, default=240)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--prefix", default="scale", help="topic names: PREFIX-0, PREFIX-1...")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for masters in [0] + [int(m) for m in args.masters.split(",")]:
        results = []
        for _ in range(args.runs):
            data = tempfile.mkdtemp(prefix="relay-cluster-scale-")
            url, servers = deployment(masters, data)
            try:
                results.append(run(url, [s.pid for s in servers], args))
            finally:
                for server in servers:
                    server.terminate()
                for server in servers:
                    server.wait(10)
                shutil.rmtree(data, ignore_errors=True)
        rates = [r["msgs_per_s"] for r in results]
        print(json.dumps({"masters": masters or "one-node Redis", "topics": args.topics,
                          "partitions": args.partitions,
                          "median_msgs_per_s": statistics.median(rates),
                          "min": min(rates), "max": max(rates),
                          "redis_cpu_per_node": results[rates.index(statistics.median_low(rates))]
                          ["redis_cpu"]}), flush=True)


if __name__ == "__main__":
    main()
