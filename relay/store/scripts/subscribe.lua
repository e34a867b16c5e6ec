-- include: backlog.lua, maxmemory.lua, staged.lua
-- subscribe: create the channel if needed and count one more consumer on this broker
-- (none when the broker id is empty: /channel/create).
-- The first channel of a topic takes over the topic backlog, deferred part included.
--
-- KEYS[1] topic channels   KEYS[2] backlog   KEYS[3] backlog deferred
-- KEYS[4] channel queue    KEYS[5] channel deferred   KEYS[6] channel msgs
-- KEYS[7] channel meta     KEYS[8] channel consumers  KEYS[9] topic due index
-- KEYS[10] topic meta (a paused topic keeps its backlog; a new channel takes its TTL)
-- KEYS[11] topic version
-- ARGV[1] channel name (also its member in the due index)   ARGV[2] broker id
-- ARGV[3] the node keys' prefix (lib/node.lua)   KEYS[12] topic ids
-- KEYS[13] the part's publishing hash (staged publishes whose steps are under way)
-- Returns {1 if the channel was created else 0, its incarnation, its empties, the cut}:
-- the cut is the count of the last message published before this call that is not in
-- the backlog (a channel created from the beginning replays the history up to it; the
-- ids a staged publish reserved but has not published yet come after it: its steps
-- publish them to the channel); the
-- incarnation (a number from the topic version key's field `channels`, new each time
-- a channel of the topic is created; not news: brokers need not look again)
-- and the count of empties (drop.lua) are what brokers compare to see that the
-- channel their consumers joined was deleted or emptied (relay/broker/wakeups.py).
past_maxmemory()
local created = redis.call('SADD', KEYS[1], ARGV[1])
if ARGV[2] ~= '' then
  redis.call('HINCRBY', KEYS[8], ARGV[2], 1)
end
local incarnation = redis.call('HGET', KEYS[7], 'incarnation')
if not incarnation then
  incarnation = redis.call('HINCRBY', KEYS[11], 'channels', 1)
  redis.call('HSET', KEYS[7], 'incarnation', incarnation)
  local ttl = redis.call('HGET', KEYS[10], 'ttl_ms')    -- the topic's TTL (ttl.lua)
  if ttl then
    redis.call('HSET', KEYS[7], 'ttl_ms', ttl, 'ttl_from', 'topic')
  end
end
local backlog_head = redis.call('LINDEX', KEYS[2], 0)
local cut = tonumber(redis.call('GET', KEYS[12]) or '0')
for _, value in ipairs(redis.call('HVALS', KEYS[13])) do
  cut = math.min(cut, read_marker(value).next - 1)
end
if backlog_head then
  cut = math.min(cut, tonumber(string.sub(record_id(backlog_head), 5), 16) - 1)
end
local reply = {created, tonumber(incarnation),
               tonumber(redis.call('HGET', KEYS[7], 'empties') or '0'), cut}
if created == 0 or redis.call('SCARD', KEYS[1]) > 1
    or redis.call('HEXISTS', KEYS[10], 'paused') == 1 then
  return reply
end

local n = redis.call('LLEN', KEYS[2])
if n > 0 then
  -- the queue of a channel created just now is normally absent: an O(1) move
  if redis.call('EXISTS', KEYS[4]) == 0 then
    redis.call('RENAME', KEYS[2], KEYS[4])
  else
    while redis.call('LMOVE', KEYS[2], KEYS[4], 'LEFT', 'RIGHT') do end
  end
  redis.call('HINCRBY', KEYS[7], 'message_count', n)
end

local deferred = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
hand_over_deferred(deferred, KEYS[6], KEYS[5], KEYS[9], ARGV[1], ARGV[3])
if #deferred > 0 then
  redis.call('HINCRBY', KEYS[7], 'message_count', #deferred / 2)
  redis.call('DEL', KEYS[3])
end
return reply
