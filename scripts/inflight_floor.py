"""What putting messages in flight and finishing them costs Redis per message, in today's
shape (a member and a record per message) and in a shape that keeps in flight by lot (one
member and one record string per group a deliver call hands out), on the embedded server:
issue 59, item 2. Each variant is a small stand-alone script over the same data, so the
figures say what a shape costs at its floor, not what relay's scripts add around it.

    .venv/bin/python scripts/inflight_floor.py [--rounds 3]

Prints a Markdown table: Redis µs per message (INFO commandstats, median of the rounds, the
variants alternating), for calls of 100 messages of 200 B from one queue, 400 calls.
"""

import argparse
import statistics

import redis

from relay import embedded

PER_CALL, CALLS, OWNER = 100, 400, "host:4150:17"

ID = "local function record_id(r) return string.sub(r, -17, -2) end\n"

DELIVER = {
    "deliver: LPOP and reply, nothing kept (the floor)":
        "return redis.call('LPOP', KEYS[1], 100)",
    "deliver: + an id per message":
        ID + """local p = redis.call('LPOP', KEYS[1], 100)
for _, r in ipairs(p) do local id = record_id(r) end
return p""",
    "deliver: today (HSET id record, ZADD deadline 'id owner')":
        ID + """local p = redis.call('LPOP', KEYS[1], 100)
local h, z = {}, {}
for _, r in ipairs(p) do
  local id = record_id(r)
  h[#h + 1], h[#h + 2] = id, r
  z[#z + 1], z[#z + 2] = ARGV[2], id .. ' ' .. ARGV[1]
end
redis.call('HSET', KEYS[2], unpack(h))
redis.call('ZADD', KEYS[3], unpack(z))
return p""",
    "deliver: by lot (records and lengths as one field, one member)":
        """local p = redis.call('LPOP', KEYS[1], 100)
local lengths = {}
for i, r in ipairs(p) do lengths[i] = #r end
redis.call('HSET', KEYS[2], ARGV[3], table.concat(lengths, ' ') .. '\\n' .. table.concat(p),
           ARGV[3] .. '.done', string.rep('0', #p))
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3] .. ' ' .. ARGV[1])
return p""",
}

FINISH = {
    "finish: today (ZMSCORE, ZREM 'id owner', HDEL id)": ("pairs", """
local held, ids = {}, {}
for i = 1, #ARGV, 2 do held[#held + 1] = ARGV[i + 1] .. ' ' .. ARGV[i] end
local scores = redis.call('ZMSCORE', KEYS[1], unpack(held))
for i = 1, #ARGV, 2 do ids[#ids + 1] = ARGV[i + 1] end
redis.call('ZREM', KEYS[1], unpack(held))
redis.call('HDEL', KEYS[2], unpack(ids))
return #scores"""),
    "finish: by lot (ZSCORE its member, mark indexes in its done string)": ("lot", """
local held = redis.call('ZSCORE', KEYS[1], ARGV[1] .. ' ' .. ARGV[2])
local done = {string.byte(redis.call('HGET', KEYS[2], ARGV[1] .. '.done'), 1, -1)}
local marks = ARGV[3]
for i = 1, #marks, 2 do done[string.byte(marks, i) * 256 + string.byte(marks, i + 1) + 1] = 49 end
redis.call('HSET', KEYS[2], ARGV[1] .. '.done', string.char(unpack(done)))
return held"""),
}


def record(n: int) -> bytes:
    """A record as relay stores one (relay/codec.py): timestamp, attempts, body, id."""
    return b"\x80" + b"\x01" * 7 + b"\0\0" + b"x" * 200 + b"%016x" % n + bytes([n % 256])


def usec(client: redis.Redis, messages: int) -> float:
    stats = client.info("commandstats")
    return sum(s["usec"] for k, s in stats.items() if k.startswith("cmdstat_evalsha")) / messages


def deliver_round(client: redis.Redis, source: str) -> float:
    client.flushall()
    pipe = client.pipeline(transaction=False)
    for c in range(CALLS):
        pipe.rpush("queue", *(record(c * PER_CALL + i) for i in range(PER_CALL)))
    pipe.execute()
    sha = client.script_load(source)
    client.config_resetstat()
    for c in range(CALLS):
        client.evalsha(sha, 3, "queue", "msgs", "inflight", OWNER, 1_800_000_000_000 + c,
                       f"L{c:015d}")
    return usec(client, CALLS * PER_CALL)


def finish_round(client: redis.Redis, shape: str, source: str) -> float:
    client.flushall()
    pipe = client.pipeline(transaction=False)
    for c in range(CALLS):
        ids = [f"{c * PER_CALL + i:016x}" for i in range(PER_CALL)]
        pipe.zadd("inflight", {f"{i} {OWNER}": 1.8e12 + c for i in ids})
        pipe.hset("msgs", mapping={i: record(c * PER_CALL + n) for n, i in enumerate(ids)})
        pipe.zadd("inflight", {f"L{c:015d} {OWNER}": 1.8e12 + c})
        pipe.hset("msgs", f"L{c:015d}.done", "0" * PER_CALL)
    pipe.execute()
    sha = client.script_load(source)
    marks = b"".join(bytes([i // 256, i % 256]) for i in range(PER_CALL))
    client.config_resetstat()
    for c in range(CALLS):
        if shape == "pairs":
            args = [x for i in range(PER_CALL) for x in (OWNER, f"{c * PER_CALL + i:016x}")]
        else:
            args = [f"L{c:015d}", OWNER, marks]
        client.evalsha(sha, 2, "inflight", "msgs", *args)
    return usec(client, CALLS * PER_CALL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with embedded.scratch_server("relay-inflight-floor-") as (port, version):
        client = redis.Redis(port=port)
        rounds: dict = {}
        for _ in range(args.rounds):
            for name, source in DELIVER.items():
                rounds.setdefault(name, []).append(deliver_round(client, source))
            for name, (shape, source) in FINISH.items():
                rounds.setdefault(name, []).append(finish_round(client, shape, source))
        print(f"Server {version}, {args.rounds} rounds, Redis µs per message in calls of "
              f"{PER_CALL}\n")
        print("| variant | median | min | max |")
        print("| --- | --- | --- | --- |")
        for name, took in rounds.items():
            print(f"| {name} | {statistics.median(took):.2f} | {min(took):.2f} | "
                  f"{max(took):.2f} |")

if __name__ == "__main__":
    main()
