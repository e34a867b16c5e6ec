"""A channel's delivery rate limit under load (issue 60's targets): 2 brokers sharing one TCP
port, 4 consumers at RDY 50 that FIN what they get, a channel prefilled with more than
the run can take, limited to --rate (200/s) for --seconds, then raised to --then (500/s)
for --seconds more, as `relay-admin limit --rate` sets it (Limits.set_rate). Reports
each window's rate (its first second left out, the time a change takes to count), the
consumers per broker, Redis' CPU while the consumers wait on the empty channel without a
limit and then with one (what a second costs it with no message at all), and Redis' work: server CPU (INFO cpu) and script calls (FCALL)
per message in each window, the brokers' calls to the bucket per message (their
/metrics' relay_redis_script_calls{script="tokens"}), and what one such call costs
(tokens.lua, 5,000 calls on the same server, INFO commandstats): the limit's cost per
message is the one times the other.

    .venv/bin/python -m scripts.bench_rate [--rate 200/s] [--then 500/s] [--seconds 30]

Prints one JSON object.
"""

import argparse
import json
import re
import threading
import time

from relay.store import Store
from relay.store.connection import connect
from relay.store.limits import parse_rate
from scripts.bench import Stack
from scripts.loadgen import Conn

TOPIC, CHANNEL, CONSUMERS, RDY = "t", "c", 4, 50
IDLE_S = 6.0    # the consumers on the channel with nothing to deliver, first


class Consumer(threading.Thread):
    """One connection at RDY 50: the time of each message it gets, each FINned."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.conn = Conn("127.0.0.1", port)
        self.conn.sock.sendall(f"SUB {TOPIC} {CHANNEL}\n".encode())
        self.conn.expect_ok()
        self.conn.sock.sendall(f"RDY {RDY}\n".encode())
        self.times: list[float] = []
        self.running = True

    def run(self) -> None:
        try:
            self.consume()
        except (EOFError, OSError):
            pass        # the stack stopped

    def consume(self) -> None:
        while self.running:
            fins = []
            for kind, data in self.conn.frames():
                if kind == 2:
                    self.times.append(time.monotonic())
                    fins.append(b"FIN " + data[10:26] + b"\n")
                elif data == b"_heartbeat_":
                    fins.append(b"NOP\n")
            if fins:
                self.conn.sock.sendall(b"".join(fins))


TOKENS_CALLS = re.compile(rb'relay_redis_script_calls_total\{script="tokens"\} ([\d.e+]+)')


def redis_work(client, stack: Stack) -> tuple[float, int, float]:
    """Redis' CPU seconds, its FCALLs, and the brokers' calls to the bucket, so far."""
    cpu = client.info("cpu")
    calls = client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0)
    tokens = sum(float(m.group(1)) for i in range(len(stack.brokers))
                 for m in [TOKENS_CALLS.search(stack.http(i, "/metrics"))] if m)
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"], calls, tokens


def window(consumers: list[Consumer], client, stack: Stack, start: float,
           seconds: float) -> dict:
    """The window from `start`: msgs/s over it, but its first second, and Redis' work."""
    time.sleep(max(0.0, start + 1.0 - time.monotonic()))
    cpu0, calls0, tokens0 = redis_work(client, stack)
    time.sleep(max(0.0, start + seconds - time.monotonic()))
    cpu1, calls1, tokens1 = redis_work(client, stack)
    got = sum(1 for c in consumers for t in c.times if start + 1.0 <= t < start + seconds)
    return {"msgs_per_s": round(got / (seconds - 1.0), 1), "messages": got,
            "redis_us_per_msg": round(1e6 * (cpu1 - cpu0) / max(got, 1), 1),
            "calls_per_msg": round((calls1 - calls0) / max(got, 1), 3),
            "tokens_calls_per_msg": round((tokens1 - tokens0) / max(got, 1), 3)}


def spread(stack: Stack) -> list[Consumer]:
    """CONSUMERS consumers, as many on each broker: the brokers share one port, so one
    that lands on a broker holding its share already is closed and made again."""
    share, consumers = CONSUMERS // len(stack.brokers), []
    while len(consumers) < CONSUMERS:
        before = [stack.connections(i) for i in range(len(stack.brokers))]
        consumer = Consumer(stack.tcp_port)
        landed = next(i for i in range(len(stack.brokers))
                      if stack.connections(i) > before[i])
        if before[landed] < share:
            consumers.append(consumer)
        else:
            consumer.conn.sock.close()
            while stack.connections(landed) > before[landed]:
                time.sleep(0.01)
    return consumers


def tokens_call_us(store: Store, client) -> float:
    """Redis µs per call to a bucket (tokens.lua), on a channel whose rate never binds."""
    store.control.create_channel(TOPIC, "bucket")
    store.limits.set_rate(TOPIC, "bucket", parse_rate("1000000/s"))
    client.config_resetstat()
    pipe = client.pipeline(transaction=False)
    for _ in range(5000):
        op = store.tokens_op(TOPIC, "bucket", 50)
        pipe.fcall(store.runner.library.scripts[op.script].function, len(op.keys), *op.keys,
                   *op.args)
    pipe.execute()
    return client.info("commandstats")["cmdstat_fcall"]["usec_per_call"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="200/s")
    parser.add_argument("--then", default="500/s")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    first, then = parse_rate(args.rate), parse_rate(args.then)
    assert first and then
    stack = Stack(2)
    try:
        client = connect(stack.url)
        store = Store(client)
        store.control.create_channel(TOPIC, CHANNEL)
        consumers = spread(stack)
        for c in consumers:
            c.start()
        unlimited = window(consumers, client, stack, time.monotonic(), IDLE_S)
        store.limits.set_rate(TOPIC, CHANNEL, first)
        idle = window(consumers, client, stack, time.monotonic(), IDLE_S)
        for _ in range(int((first.per_s + then.per_s) * args.seconds * 1.2) // 1000 + 1):
            store.publish(TOPIC, [b"x" * 200] * 1000)
        start = time.monotonic()
        before = window(consumers, client, stack, start, args.seconds)
        changed = time.monotonic()
        store.limits.set_rate(TOPIC, CHANNEL, then)
        after = window(consumers, client, stack, changed, args.seconds)
        brokers = [json.loads(stack.http(i, "/stats?format=json&topic=t"))
                   ["topics"][0]["channels"][0]["clients"] for i in range(2)]
        for c in consumers:
            c.running = False
        print(json.dumps({
            "rate": first.per_s, "burst": first.burst, "then": then.per_s,
            "then_burst": then.burst, "seconds": args.seconds,
            "consumers_per_broker": [len(b) for b in brokers],
            "idle_redis_cpu_us_per_s": {
                "unlimited": round(unlimited["redis_us_per_msg"] / (IDLE_S - 1.0), 1),
                "limited": round(idle["redis_us_per_msg"] / (IDLE_S - 1.0), 1)},
            "at_rate": before, "at_then": after,
            "tokens_call_us": tokens_call_us(store, client)}, indent=1))
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
