"""What a deliver and a finish cost Redis per call, as a function of relay's library (FCALL)
and as the same code sent as a script (EVALSHA), on the embedded server: issue 59, item 1.
A script defines every lib function it includes again on each call; a library defines
them once, at FUNCTION LOAD.

    .venv/bin/python scripts/function_cost.py [--rounds 5]

Prints a Markdown table: Redis µs per call (INFO commandstats, median of the rounds, the
two ways alternating), for a trivial script, the definitions of deliver's lib files alone,
a deliver that finds nothing, a deliver of 1 and of 100 messages, and a finish of 100.
"""

import argparse
import statistics
from importlib import resources

import redis

from relay import embedded
from relay.store import Store, codes
from relay.store.keys import ChannelKeys
from relay.store.runner import with_includes

BODY = b"x" * 200
CALLS = 3000
BATCHES = 300


def as_script(name: str) -> bytes:
    """scripts/<name>.lua as a script: its lib files before it, the codes in place."""
    folder = resources.files("relay.store") / "scripts"
    return codes.inline(with_includes(folder / "lib", (folder / f"{name}.lua").read_bytes(),
                                      set()))


def per_call(client: redis.Redis, command: str, calls: list) -> float:
    """Redis µs per call of `command` (FCALL or EVALSHA) over the calls, in one pipeline."""
    client.config_resetstat()
    pipe = client.pipeline(transaction=False)
    for args in calls:
        pipe.execute_command(command, *args)
    for reply in pipe.execute(raise_on_error=False):
        if isinstance(reply, Exception):
            raise reply
    return client.info("commandstats")[f"cmdstat_{command.lower()}"]["usec_per_call"]


def one_round(client: redis.Redis, store: Store, way: str) -> dict:
    """Each case once, by FCALL or by EVALSHA of the same code."""
    shas = {name: client.script_load(as_script(name)) for name in ("deliver", "finish")}
    source = as_script("deliver")
    defs = client.script_load(source[:source.index(b"local queue, inflight, msgs, due_index")]
                              + b"return 1")
    trivial = client.script_load(b"return 1")

    def call(op) -> tuple:
        target = store.runner.library.scripts[op.script].function if way == "FCALL" \
            else shas[op.script]
        return (target, len(op.keys), *op.keys, *op.args)

    def deliver(count: int) -> tuple:
        return call(store.deliver_op("t", "c", [("o", 60_000, count)]))

    out = {}
    if way == "EVALSHA":
        out["trivial script"] = per_call(client, "EVALSHA", [(trivial, 0)] * CALLS)
        out["deliver's lib definitions, then return"] = per_call(
            client, "EVALSHA", [(defs, 0)] * CALLS)
    client.flushall()
    store.subscribe("t", "c", "b")
    out["deliver, nothing there"] = per_call(client, way, [deliver(1)] * CALLS)
    for _ in range(CALLS // 100):
        store.publish("t", [BODY] * 100)
    out["deliver 1"] = per_call(client, way, [deliver(1)] * CALLS)
    client.flushall()
    store.subscribe("t", "c", "b")
    for _ in range(BATCHES):
        store.publish("t", [BODY] * 100)
    out["deliver 100"] = per_call(client, way, [deliver(100)] * BATCHES)
    ids = client.hkeys(ChannelKeys.of("t", "c").msgs)
    finishes = [call(store.finish_op("t", "c", [("o", i) for i in ids[n:n + 100]]))
                for n in range(0, len(ids), 100)]
    out["finish 100"] = per_call(client, way, finishes)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with embedded.scratch_server("relay-function-cost-") as (port, version):
        client = redis.Redis(port=port)
        store = Store(client)
        rounds: dict = {"FCALL": [], "EVALSHA": []}
        for _ in range(args.rounds):
            for way in rounds:
                rounds[way].append(one_round(client, store, way))
        cases = list(dict.fromkeys(k for way in rounds.values() for r in way for k in r))
        print(f"Server {version}, medians of {args.rounds} rounds, Redis µs per call\n")
        print("| call | EVALSHA (a script) | FCALL (the library) |")
        print("| --- | --- | --- |")
        for case in cases:
            cells = [f"{statistics.median(r[case] for r in rounds[way]):.1f}"
                     if case in rounds[way][0] else "" for way in ("EVALSHA", "FCALL")]
            print(f"| {case} | {' | '.join(cells)} |")

if __name__ == "__main__":
    main()
