-- include: backlog.lua, staged.lua, chunked.lua, record.lua, queue.lua
-- subscribe: create the channel if needed and count one more consumer on this broker
-- (none when the broker id is empty: /channel/create).
-- The first channel of a topic takes over the topic backlog, deferred part included:
-- in this call if that is cheap (the backlog renamed as its queue, or up to HAND_OVER
-- records moved one by one), else in steps as an unpause moves one (pause_topic.lua),
-- so that no call holds Redis for a backlog of any size: the topic is marked UNPAUSING
-- (lib/backlog.lua) and the reply says so; the caller runs the steps (Store.hand_over),
-- and so does a broker whose SUB finds the topic marked (its steps' runner died).
--
-- KEYS[1] topic channels   KEYS[2] backlog   KEYS[3] backlog deferred
-- KEYS[4] channel queue    KEYS[5] channel deferred   KEYS[6] channel msgs
-- KEYS[7] channel meta     KEYS[8] channel consumers  KEYS[9] topic due index
-- KEYS[10] topic meta (a paused topic keeps its backlog; a new channel takes its TTL)
-- KEYS[11] topic version   KEYS[12] topic ids
-- KEYS[13] the part's publishing hash (staged publishes whose steps are under way)
-- KEYS[14] channel urgent (a backlog that holds messages of priority 1-9, topic meta
-- field urgent_backlog: lib/append.lua, goes over one by one: lib/queue.lua)
-- ARGV[1] channel name (also its member in the due index)   ARGV[2] broker id
-- ARGV[3] the node keys' prefix (lib/node.lua)
-- Returns {1 if the channel was created else 0, its incarnation, its empties, the cut,
-- the number of channels (a publish to many goes wide: lib/wide.lua), 1 if the topic's
-- backlog is to go over in steps (UNPAUSING) else 0}:
-- the cut is the count of the last message published before this call that is not in
-- the backlog (a channel created from the beginning replays the history up to it; the
-- ids a staged publish reserved but has not published yet come after it: its steps
-- publish them to the channel); the
-- incarnation (a number from the topic version key's field `channels`, new each time
-- a channel of the topic is created; not news: brokers need not look again)
-- and the count of empties (drop.lua) are what brokers compare to see that the
-- channel their consumers joined was deleted or emptied (relay/broker/wakeups.py).
local channels, backlog, backlog_deferred, queue = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local deferred, msgs, channel_meta, consumers = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local due_index, topic_meta, version, topic_ids = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local publishing_hash = KEYS[13]
local channel, broker, node = ARGV[1], ARGV[2], ARGV[3]

local created = redis.call('SADD', channels, channel)
if broker ~= '' then
  redis.call('HINCRBY', consumers, broker, 1)
end
local incarnation = redis.call('HGET', channel_meta, 'incarnation')
if not incarnation then
  incarnation = redis.call('HINCRBY', version, 'channels', 1)
  redis.call('HSET', channel_meta, 'incarnation', incarnation)
  local ttl = redis.call('HGET', topic_meta, 'ttl_ms')    -- the topic's TTL (ttl.lua)
  if ttl then
    redis.call('HSET', channel_meta, 'ttl_ms', ttl, 'ttl_from', 'topic')
  end
end
local backlog_head = redis.call('LINDEX', backlog, 0)
local cut = tonumber(redis.call('GET', topic_ids) or '0')
for _, value in ipairs(redis.call('HVALS', publishing_hash)) do
  cut = math.min(cut, read_marker(value).next - 1)
end
if backlog_head then
  cut = math.min(cut, tonumber(string.sub(record_id(backlog_head), 5), 16) - 1)
end
local paused = redis.call('HGET', topic_meta, 'paused')
local reply = {created, tonumber(incarnation),
               tonumber(redis.call('HGET', channel_meta, 'empties') or '0'), cut,
               redis.call('SCARD', channels), paused == UNPAUSING and 1 or 0}
if created == 0 or redis.call('SCARD', channels) > 1 or paused then
  return reply
end

local HAND_OVER = 10000     -- records moved in this call at most
local n = redis.call('LLEN', backlog)
local urgent_backlog = redis.call('HEXISTS', topic_meta, 'urgent_backlog') == 1
if n > 0 and not urgent_backlog and redis.call('EXISTS', queue) == 0 then
  redis.call('RENAME', backlog, queue)    -- the queue of a new channel: an O(1) move
  redis.call('HINCRBY', channel_meta, 'message_count', n)
  n = 0
end
if n + redis.call('ZCARD', backlog_deferred) > HAND_OVER then
  redis.call('HSET', topic_meta, 'paused', UNPAUSING)
  reply[6] = 1
  return reply
end
if n > 0 then
  enqueue({queue = queue, urgent = KEYS[14], meta = channel_meta},
          redis.call('LRANGE', backlog, 0, -1))
  redis.call('DEL', backlog)
  redis.call('HDEL', topic_meta, 'urgent_backlog')
  redis.call('HINCRBY', channel_meta, 'message_count', n)
end

local backlog_due = redis.call('ZRANGE', backlog_deferred, 0, -1, 'WITHSCORES')
hand_over_deferred(backlog_due, msgs, deferred, due_index, channel, node)
if #backlog_due > 0 then
  redis.call('HINCRBY', channel_meta, 'message_count', #backlog_due / 2)
  redis.call('DEL', backlog_deferred)
end
return reply
