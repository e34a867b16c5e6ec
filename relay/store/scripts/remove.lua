-- include: record.lua, queue.lua, order.lua
-- remove: relay-admin msg --delete. Takes one message out of a channel where it waits:
-- a queued record dropped (LREM of that exact record, the first from the head), a
-- deferred message cancelled (out of the deferred ZSET, its record out of the msgs
-- hash) or, on an ordered channel, one waiting behind its key (its entry out of the msgs
-- hash, or its member out of the waiting ZSET: lib/order.lua).
-- A queued or deferred one releases its order key (lib/order.lua). A message in
-- flight is not touched: a consumer holds it. A removal is counted in the channel
-- meta's deleted_count (in /stats).
--
-- KEYS[1] queue   KEYS[2] deferred   KEYS[3] msgs   KEYS[4] channel meta   KEYS[5] gate
-- KEYS[6] key_of   KEYS[7] waiting   KEYS[8] topic due index   KEYS[9] topic version
-- KEYS[10] urgent (a queued record of priority 1-9 is in its list: lib/queue.lua)
-- ARGV[1] "queued", "deferred" or "waiting"   ARGV[2] the queued record, the deferred id
-- or the waiting one's ZSET member or "<order key> <seq>" (relay/store/ordering.py's
-- Waiting.element)   ARGV[3] channel name   ARGV[4] wake pub/sub channel
-- ARGV[5] the node keys' prefix   ARGV[6] the message's id
-- Returns 1 removed, 0 not there any more (delivered, finished or gone meanwhile).
-- It goes on at maxmemory (runner.REFUSED_AT_MAXMEMORY).
local queue, deferred, msgs, channel_meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local gate, key_of, waiting = KEYS[5], KEYS[6], KEYS[7]
local due_index, version = KEYS[8], KEYS[9]
local state, target, channel, wake, node = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local removed, id = 0, nil
if state == 'queued' then
  local priority = record_priority(target)
  if priority > 0 then
    removed = redis.call('LREM', urgent_list(KEYS[10], priority), 1, target)
    urgent_taken(KEYS[10], priority, removed)
  else
    removed = redis.call('LREM', queue, 1, target)
  end
  id = record_id(target)
elseif state == 'deferred' then
  removed = redis.call('ZREM', deferred, target)
  if removed == 1 then redis.call('HDEL', msgs, target) end
  id = target
else
  local entry = redis.call('HGET', msgs, target)     -- "<order key> <seq>": numbered
  if entry and split_entry(entry) == ARGV[6] then
    removed = redis.call('HDEL', msgs, target)
    redis.call('HINCRBY', channel_meta, 'order_waiting', -1)
  elseif not entry then
    removed = redis.call('ZREM', waiting, target)
  end
end
if removed == 1 then
  redis.call('HINCRBY', channel_meta, 'deleted_count', 1)
  if id then
    local o = order_gate(queue, deferred, msgs, channel_meta, gate, key_of, waiting, KEYS[10],
                         due_index, version, channel, wake, node)
    order_release(o, {id})
  end
end
return removed
