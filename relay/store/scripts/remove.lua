-- include: record.lua, order.lua
-- remove: relay-admin msg --delete. Takes one message out of a channel where it waits:
-- a queued record dropped (LREM of that exact record, the first from the head), a
-- deferred message cancelled (out of the deferred ZSET, its record out of the msgs
-- hash) or, on an ordered channel, one waiting behind its key (out of the waiting ZSET).
-- A queued or deferred one releases its order key (lib/order.lua). A message in
-- flight is not touched: a consumer holds it. A removal is counted in the channel
-- meta's deleted_count (in /stats).
--
-- KEYS[1] queue   KEYS[2] deferred   KEYS[3] msgs   KEYS[4] channel meta   KEYS[5] gate
-- KEYS[6] key_of   KEYS[7] waiting   KEYS[8] topic due index   KEYS[9] topic version
-- ARGV[1] "queued", "deferred" or "waiting"   ARGV[2] the queued record, the deferred id
-- or the waiting member   ARGV[3] channel name   ARGV[4] wake pub/sub channel
-- ARGV[5] the node keys' prefix
-- Returns 1 removed, 0 not there any more (delivered, finished or gone meanwhile).
-- Its first write is LREM or ZREM, which Redis lets through at maxmemory
-- (lib/maxmemory.lua).
local removed, id = 0, nil
if ARGV[1] == 'queued' then
  removed = redis.call('LREM', KEYS[1], 1, ARGV[2])
  id = record_id(ARGV[2])
elseif ARGV[1] == 'deferred' then
  removed = redis.call('ZREM', KEYS[2], ARGV[2])
  if removed == 1 then redis.call('HDEL', KEYS[3], ARGV[2]) end
  id = ARGV[2]
else
  removed = redis.call('ZREM', KEYS[7], ARGV[2])
end
if removed == 1 then
  redis.call('HINCRBY', KEYS[4], 'deleted_count', 1)
  if id then
    order_release({queue = KEYS[1], deferred = KEYS[2], msgs = KEYS[3], gate = KEYS[5],
                   key_of = KEYS[6], waiting = KEYS[7], due_index = KEYS[8],
                   version = KEYS[9], channel = ARGV[3], wake = ARGV[4], node = ARGV[5]},
                  {id})
  end
end
return removed
