-- include: time.lua, lease.lua, queue.lua, news.lua
-- requeue: put messages their owner gave back (REQ, or the connection closed)
-- at the tail of the queue, or deferred for a while.
--
-- KEYS[1] queue   KEYS[2] inflight   KEYS[3] msgs   KEYS[4] leases
-- KEYS[5] deferred   KEYS[6] channel meta   KEYS[7] topic due index
-- KEYS[8] topic version (news.lua)
-- ARGV[1] channel name (also its member in the due index)   ARGV[2] wake pub/sub channel
-- ARGV[3] the node keys' prefix (node.lua), then triples: owner, id, delay ms
-- Returns per triple: 1 requeued, 0 not in flight, -1 in flight for another client.
local now = now_ms()
local out = {}
local requeued, ready, taken = 0, {}, {}
for i = 4, #ARGV, 3 do
  local owner, id, delay = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local delivered, refused = held(KEYS[4], id, owner)
  if not delivered or taken[id] then
    out[#out + 1] = refused or 0
  else
    taken[id] = true
    if delay > 0 then
      redis.call('ZREM', KEYS[2], id)
      redis.call('HDEL', KEYS[4], id)
      redis.call('ZADD', KEYS[5], now + delay, id)
      due_lower(ARGV[3], KEYS[7], ARGV[1], now + delay)
    else
      ready[#ready + 1] = id
    end
    requeued = requeued + 1
    out[#out + 1] = 1
  end
end
back_to_queue(KEYS[1], KEYS[2], KEYS[3], ready, KEYS[4])
if requeued > 0 then
  redis.call('HINCRBY', KEYS[6], 'requeue_count', requeued)
end
if #ready > 0 then
  announce(KEYS[8], ARGV[2], ARGV[1], ARGV[3])
end
return out
