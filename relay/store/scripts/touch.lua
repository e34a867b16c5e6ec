-- include: time.lua, inflight.lua, maxmemory.lua
-- touch: push the deadline of in-flight messages back (TOUCH). The broker caps each
-- timeout so that the deadline stays within max msg timeout of the delivery (nsqd
-- Channel.TouchMessage): it knows when it delivered each message, Redis does not keep it.
--
-- KEYS[1] inflight   KEYS[2] msgs   KEYS[3] deferred
-- ARGV triples: owner, id, timeout ms from now
-- Returns per triple: the new deadline (ms), 0 not in flight, -1 in flight for another
-- client.
past_maxmemory()
local k = {inflight = KEYS[1], msgs = KEYS[2], deferred = KEYS[3]}
local now = now_ms()
local held, codes = holdings(k, ARGV, 1, #ARGV, 3)
local out = {}
for n, member in ipairs(held) do
  if not member then
    out[n] = codes[n]
  else
    local deadline = now + tonumber(ARGV[3 * n])
    redis.call('ZADD', k.inflight, 'XX', deadline, member)
    out[n] = deadline
  end
end
return out
