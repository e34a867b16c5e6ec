-- include: fanout.lua, time.lua, chunked.lua, record.lua, news.lua
-- publish: append messages to every channel of a topic, now or deferred.
-- With no channel yet, they wait in the topic backlog for the first one
-- (nsqd keeps them in the topic queue the same way).
--
-- KEYS[1] topic ids (STRING)   KEYS[2] topic meta   KEYS[3] topic channels
-- KEYS[4] backlog (LIST)       KEYS[5] backlog deferred (ZSET record -> due)
-- KEYS[6] topic due index (scanners)   KEYS[7] topic version (news.lua), then the
-- channels' keys (fanout.lua)
-- ARGV[1..ARG0] the channels (fanout.lua), then: wake pub/sub channel,
-- 8-byte timestamp, defer ms (0 = now), the part's number (keys.py), bodies...
-- Ids are the part's number in 4 hex digits, then the topic's count in 12.
-- Returns the count of the last message (ids are consecutive), or the stale reply.
local stale = stale_channels(KEYS[3])
if stale then return stale end
local wake, timestamp = ARGV[ARG0 + 1], ARGV[ARG0 + 2]
local defer = tonumber(ARGV[ARG0 + 3])
local part = tonumber(ARGV[ARG0 + 4])
local n = #ARGV - ARG0 - 4
local last = redis.call('INCRBY', KEYS[1], n)
local first = last - n + 1

local ids, records, bytes = {}, {}, 0
for i = 1, n do
  local body = ARGV[ARG0 + 4 + i]
  ids[i] = string.format('%04x%012x', part, first + i - 1)
  records[i] = new_record(timestamp, ids[i], body)
  bytes = bytes + #body
end

-- {first[1], second[1], first[2], ...}; a non-table `first` repeats.
local function interleave(first, second)
  local out = {}
  for i = 1, n do
    out[2 * i - 1] = type(first) == 'table' and first[i] or first
    out[2 * i] = second[i]
  end
  return out
end

local channels = N_CHANNELS
if redis.call('HEXISTS', KEYS[2], 'paused') == 1 then
  channels = 0  -- a paused topic keeps everything in its backlog (pause_topic.lua)
end
if defer == 0 then
  if channels == 0 then
    call_chunked('RPUSH', KEYS[4], records)
  end
  for c = 1, channels do
    call_chunked('RPUSH', channel_key(c, 'queue'), records)
    redis.call('HINCRBY', channel_key(c, 'meta'), 'message_count', n)
  end
  if channels > 0 then
    announce(KEYS[7], wake, '')
  end
else
  local due = now_ms() + defer
  if channels == 0 then
    call_chunked('ZADD', KEYS[5], interleave(due, records))
  end
  for c = 1, channels do
    call_chunked('HSET', channel_key(c, 'msgs'), interleave(ids, records))
    call_chunked('ZADD', channel_key(c, 'deferred'), interleave(due, ids))
    redis.call('HINCRBY', channel_key(c, 'meta'), 'message_count', n)
    redis.call('ZADD', KEYS[6], 'LT', due, channel_name(c))
  end
end
redis.call('HINCRBY', KEYS[2], 'message_count', n)
redis.call('HINCRBY', KEYS[2], 'message_bytes', bytes)
return last
