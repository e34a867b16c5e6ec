-- include: time.lua, lease.lua
-- touch: push the deadline of in-flight messages back (TOUCH), never past
-- delivery time + max msg timeout (nsqd Channel.TouchMessage).
--
-- KEYS[1] inflight   KEYS[2] leases
-- ARGV[1] max msg timeout ms, then triples: owner, id, msg timeout ms
-- Returns per triple: the new deadline (ms), 0 not in flight, -1 in flight for another client.
local now = now_ms()
local max_timeout = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 3 do
  local owner, id = ARGV[i], ARGV[i + 1]
  local delivered, refused = held(KEYS[2], id, owner)
  if not delivered then
    out[#out + 1] = refused
  else
    local deadline = math.min(now + tonumber(ARGV[i + 2]), delivered + max_timeout)
    redis.call('ZADD', KEYS[1], 'XX', deadline, id)
    out[#out + 1] = deadline
  end
end
return out
