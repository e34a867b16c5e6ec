-- include: lease.lua
-- finish: forget messages their owner finished (FIN), for any number of owners.
--
-- KEYS[1] inflight   KEYS[2] msgs   KEYS[3] leases
-- ARGV pairs: owner, id
-- Returns per pair: 1 finished, 0 not in flight, -1 in flight for another client.
local out = {}
for i = 1, #ARGV, 2 do
  local owner, id = ARGV[i], ARGV[i + 1]
  local delivered, refused = held(KEYS[3], id, owner)
  if not delivered then
    out[#out + 1] = refused
  else
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    out[#out + 1] = 1
  end
end
return out
