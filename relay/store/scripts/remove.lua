-- remove: relay-admin msg --delete. Takes one message out of a channel where it waits:
-- a queued record dropped (LREM of that exact record, the first from the head) or a
-- deferred message cancelled (out of the deferred ZSET, its record out of the msgs
-- hash). A message in flight is not touched: a consumer holds it. A removal is
-- counted in the channel meta's deleted_count (in /stats).
--
-- KEYS[1] queue   KEYS[2] deferred   KEYS[3] msgs   KEYS[4] channel meta
-- ARGV[1] "queued" or "deferred"   ARGV[2] the queued record, or the deferred id
-- Returns 1 removed, 0 not there any more (delivered, finished or gone meanwhile).
-- Its first write is LREM or ZREM, which Redis lets through at maxmemory
-- (lib/maxmemory.lua).
local removed
if ARGV[1] == 'queued' then
  removed = redis.call('LREM', KEYS[1], 1, ARGV[2])
else
  removed = redis.call('ZREM', KEYS[2], ARGV[2])
  if removed == 1 then redis.call('HDEL', KEYS[3], ARGV[2]) end
end
if removed == 1 then redis.call('HINCRBY', KEYS[4], 'deleted_count', 1) end
return removed
