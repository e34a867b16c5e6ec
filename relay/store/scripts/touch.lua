-- include: time.lua, inflight.lua
-- touch: push the deadline of in-flight messages back (TOUCH). The broker caps each
-- timeout so that the deadline stays within max msg timeout of the delivery (nsqd
-- Channel.TouchMessage): it knows when it delivered each message, Redis does not keep it.
--
-- KEYS[1] inflight   KEYS[2] msgs   KEYS[3] deferred
-- ARGV triples: owner, id, timeout ms from now
-- Returns per triple: the new deadline (ms), CODE.NOT_IN_FLIGHT not in flight,
-- CODE.NOT_OWNER in flight for another client.
local inflight, msgs, deferred = KEYS[1], KEYS[2], KEYS[3]
local FIRST_TRIPLE = 1

local k = {inflight = inflight, msgs = msgs, deferred = deferred}
local now = now_ms()
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
