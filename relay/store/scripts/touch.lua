-- include: time.lua, inflight.lua
-- touch: push the deadline of in-flight messages back (TOUCH). The broker caps each
-- timeout so that the deadline stays within max msg timeout of the delivery (nsqd
-- Channel.TouchMessage): it knows when it delivered each message, Redis does not keep it.
--
-- KEYS[1] inflight   KEYS[2] msgs   KEYS[3] deferred   KEYS[4] channel meta
-- ARGV triples: owner, id (or lot item, whose lot goes back to one member per message
-- first: lib/inflight.lua), timeout ms from now
-- Returns per triple: the new deadline (ms), CODE.NOT_IN_FLIGHT not in flight,
-- CODE.NOT_OWNER in flight for another client.
local inflight, msgs, deferred, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local FIRST_TRIPLE = 1

local k = {inflight = inflight, msgs = msgs, deferred = deferred, meta = meta}
local now = now_ms()
unlot(k, ARGV, FIRST_TRIPLE, #ARGV, 3)
local held, codes = holdings(k, ARGV, FIRST_TRIPLE, #ARGV, 3)
local out = {}
for n, member in ipairs(held) do
  if not member then
    out[n] = codes[n]
  else
    local deadline = now + tonumber(ARGV[FIRST_TRIPLE + 3 * n - 1])
    redis.call('ZADD', inflight, 'XX', deadline, member)
    out[n] = deadline
  end
end
return out
