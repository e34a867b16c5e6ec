"""Where Redis spends its CPU per message in relay's scripts, from one Python process with
no broker in between: publish (MPUB batches of 100), deliver (batches of 100 into a
growing in-flight set) and finish (the same batches), each step's server CPU (INFO cpu,
user + sys) over its messages, and the commands the scripts ran inside (INFO
commandstats: FCALL's time includes theirs).

    .venv/bin/python scripts/redis_profile.py --redis-url redis://127.0.0.1:6379/0 \
        [--batches 1500] [--size 200]

Prints one JSON line: {"publish_us": .., "deliver_us": .., "finish_us": .., "commands":
{name: µs per message}}. It flushes the database it is given. `--lots` delivers as a
broker does once data layout 4 is in force: each batch in flight as one lot;
`--per-call N` makes the batches N messages (a consumer at RDY 100 frees credit a few
messages at a time).

`--drain KEYS` instead drains `--batches` x 100 messages over KEYS order keys, as 4
consumers at RDY 100 do: each deliver call of 4 groups of 100 finishes the messages the
call before delivered (the FINs folded in, as a broker's group commit folds them), on a
channel ordered (its keys one message out at a time) and on the same channel unordered,
alternately, `--rounds` times: {"ordered_us": [...], "unordered_us": [...], "commands":
{variant: {name: µs per message}}} (the last round's); with `--lots`, as a broker does
under data layout 4, in lots whose FINs name their items.

`--strings` instead times a script that builds 2,500 strings of PREFIX bytes, a 16-hex id
and a 200 B body, for prefixes of 0-23 bytes: Lua 5.1 hashes a long string by a sample
of its bytes, so whether ids that differ only in their low digits collide depends on
where they sit (BENCHMARKS.md).

`--elements` instead times, from Lua (os.clock), each command an ordered release is made
of, per element of a variadic call of 400, on a hash of 100,000 fields of 150 B (as the
drain's msgs hash) and one of 1,000 short values (as its gate and key_of), and two Lua
string operations: {"us_per_element": {name: median µs over --rounds}}. A design's floor
is the elements it moves per message times these.
"""

import argparse
import json
import statistics
import time

import redis

from relay.codec import record_id
from relay.store import Store, inflight
from relay.store.batchers import finishing_first

BATCH = 100


STRINGS = """
local n, prefix = tonumber(ARGV[1]), string.rep('h', tonumber(ARGV[2]))
local body, made = string.rep('x', 200), {}
for i = 1, n do made[i] = prefix .. string.format('%016x', i) .. body end
return #made
"""


ELEMENTS = """
local n, took = tonumber(ARGV[1]), {}
local fields, keys, pairs_, records = {}, {}, {}, nil
for i = 1, n do
  keys[i] = 'k' .. ((i * 7) % 1000)
  fields[i] = keys[i] .. ' ' .. (i % 100)
  pairs_[2 * i - 1], pairs_[2 * i] = keys[i], '0123456789abcdef 6 9'
end
local function timed(name, fn)
  local start = os.clock()
  fn()
  took[#took + 1], took[#took + 2] = name, tostring((os.clock() - start) * 1e6 / n)
end
timed('HMGET msgs', function() records = redis.call('HMGET', 'msgs', unpack(fields)) end)
timed('HMGET gate', function() redis.call('HMGET', 'gate', unpack(keys)) end)
timed('HSET gate', function() redis.call('HSET', 'gate', unpack(pairs_)) end)
timed('RPUSH queue', function() redis.call('RPUSH', 'queue', unpack(records)) end)
timed('LPOP queue', function() redis.call('LPOP', 'queue', n) end)
timed('HDEL msgs', function() redis.call('HDEL', 'msgs', unpack(fields)) end)
timed('string.sub', function() for i = 1, n do local _ = string.sub(records[i], -17, -2) end end)
timed('concat', function() for i = 1, n do local _ = keys[i] .. ' ' .. keys[i] end end)
return took
"""


def elements(url: str, rounds: int) -> dict:
    """µs per element of each command of a release, as Lua calls them (ELEMENTS)."""
    client = redis.Redis.from_url(url)
    taken: dict[str, list[float]] = {}
    for _ in range(rounds):
        client.flushdb()
        pipe = client.pipeline()
        for start in range(0, 100_000, 5000):
            pipe.hset("msgs", mapping={f"k{i % 1000} {i // 1000}": b"\x80" + b"x" * 149
                                       for i in range(start, start + 5000)})
        pipe.hset("gate", mapping={f"k{i}": "0123456789abcdef 5 9" for i in range(1000)})
        pipe.execute()
        reply = client.eval(ELEMENTS, 0, 400)
        for name, value in zip(reply[::2], reply[1::2]):
            taken.setdefault(name.decode(), []).append(float(value))
    return {"us_per_element": {name: round(statistics.median(values), 3)
                               for name, values in taken.items()}}


def strings(url: str) -> dict:
    """ms to build 2,500 strings in one script, by the bytes before their id."""
    client = redis.Redis.from_url(url)
    sha, took = client.script_load(STRINGS), {}
    for prefix in (0, 1, 3, 5, 8, 10, 20, 23):
        start = time.perf_counter()
        client.evalsha(sha, 0, 2500, prefix)
        took[prefix] = round((time.perf_counter() - start) * 1000, 1)
    return {"ms_by_prefix": took}


def cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]


def profile(url: str, batches: int, size: int, lots: bool = False,
            per_call: int = BATCH) -> dict:
    client = redis.Redis.from_url(url)
    client.flushdb()
    store, owner, body = Store(client), "profile:1", b"x" * size
    store.subscribe("profile", "c", "profile")
    client.config_resetstat()
    messages = batches * per_call
    marks = [cpu(client)]
    for _ in range(batches):
        store.publish("profile", [body] * per_call)
    marks.append(cpu(client))
    delivered = [store.run(store.deliver_op("profile", "c", [(owner, 600_000, per_call)],
                                            lots=lots)) for _ in range(batches)]
    marks.append(cpu(client))
    for reply in delivered:
        named = inflight.items([record_id(r) for r in reply[0]], reply.lot(0))
        store.finish("profile", "c", [(owner, item) for item in named])
    marks.append(cpu(client))
    per_message = [round((b - a) * 1e6 / messages, 2) for a, b in zip(marks, marks[1:])]
    commands = {name.removeprefix("cmdstat_"): round(stats["usec"] / messages, 2)
                for name, stats in client.info("commandstats").items()
                if stats["usec"] / messages >= 0.01}
    return {"publish_us": per_message[0], "deliver_us": per_message[1],
            "finish_us": per_message[2], "commands": commands}


def drain(url: str, messages: int, keys: int, ordered: bool,
          lots: bool = False) -> tuple[float, dict]:
    """Server CPU µs per message draining `messages` over `keys` order keys, and the
    commands inside (µs per message); with `lots` in lots, FINs naming their items."""
    client = redis.Redis.from_url(url)
    client.flushdb()
    store = Store(client)
    store.subscribe("drain", "c", "profile")
    if ordered:
        store.ordering.set_ordered("drain", "c", True)
    body = b"x" * 100
    for start in range(0, messages, BATCH):
        store.dedup.publish_keyed("drain", [body] * BATCH, None, 0,
                                  [b"k%d" % ((start + i) % keys) for i in range(BATCH)])
    owners = [f"profile:{i}" for i in range(4)]
    client.config_resetstat()
    before, got, held = cpu(client), 0, []
    while got < messages:
        deliver = store.deliver_op("drain", "c", [(o, 600_000, BATCH) for o in owners],
                                   lots=lots)
        if held:
            deliver = finishing_first(deliver, store.finish_op("drain", "c", held))
        reply = store.run(deliver)
        held = [(o, item) for n, (o, records) in enumerate(zip(owners, reply))
                for item in inflight.items([record_id(r) for r in records], reply.lot(n))]
        got += len(held)
    store.finish("drain", "c", held)
    used = (cpu(client) - before) * 1e6 / messages
    commands = {name.removeprefix("cmdstat_"): round(stats["usec"] / messages, 2)
                for name, stats in client.info("commandstats").items()
                if stats["usec"] / messages >= 0.05}
    return round(used, 2), commands


def drains(url: str, messages: int, keys: int, rounds: int, lots: bool = False) -> dict:
    out: dict = {"ordered_us": [], "unordered_us": [], "commands": {}}
    for _ in range(rounds):
        for variant in ("ordered", "unordered"):
            used, out["commands"][variant] = drain(url, messages, keys, variant == "ordered",
                                                   lots)
            out[f"{variant}_us"].append(used)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--batches", type=int, default=1500)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--strings", action="store_true")
    parser.add_argument("--elements", action="store_true")
    parser.add_argument("--per-call", type=int, default=BATCH,
                        help="messages per publish, deliver and finish call")
    parser.add_argument("--lots", action="store_true",
                        help="deliver as a broker does under data layout 4 (in lots)")
    parser.add_argument("--drain", type=int, metavar="KEYS")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.drain:
        result = drains(args.redis_url, args.batches * BATCH, args.drain, args.rounds,
                        args.lots)
    elif args.elements:
        result = elements(args.redis_url, args.rounds)
    elif args.strings:
        result = strings(args.redis_url)
    else:
        result = profile(args.redis_url, args.batches, args.size, args.lots, args.per_call)
    print(json.dumps(result), flush=True)
