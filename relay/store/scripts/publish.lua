-- publish: append messages to every channel of a topic, now or deferred.
-- With no channel yet, they wait in the topic backlog for the first one
-- (nsqd keeps them in the topic queue the same way).
--
-- KEYS[1] topic ids (STRING)   KEYS[2] topic meta   KEYS[3] topic channels
-- KEYS[4] backlog (LIST)       KEYS[5] backlog deferred (ZSET record -> due)
-- KEYS[6] scanners' due index
-- ARGV[1] channel key prefix   ARGV[2] topic name   ARGV[3] wake pub/sub channel
-- ARGV[4] 8-byte timestamp     ARGV[5] defer ms (0 = now)   ARGV[6..] bodies
-- Returns the id number of the last message (ids are consecutive).
local n = #ARGV - 5
local last = redis.call('INCRBY', KEYS[1], n)
local first = last - n + 1
local head = ARGV[4] .. string.char(0, 0)
local defer = tonumber(ARGV[5])

local ids, records, bytes = {}, {}, 0
for i = 1, n do
  local body = ARGV[5 + i]
  ids[i] = string.format('%016x', first + i - 1)
  records[i] = head .. ids[i] .. body
  bytes = bytes + #body
end

-- Commands with many arguments go in chunks: Lua's unpack() has a stack limit.
local function call_chunked(cmd, key, args, step)
  for i = 1, #args, step do
    redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
  end
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

local channels = redis.call('SMEMBERS', KEYS[3])
if redis.call('HEXISTS', KEYS[2], 'paused') == 1 then
  channels = {}  -- a paused topic keeps everything in its backlog (pause_topic.lua)
end
if defer == 0 then
  if #channels == 0 then
    call_chunked('RPUSH', KEYS[4], records, 1000)
  end
  for _, c in ipairs(channels) do
    local p = ARGV[1] .. c .. ':'
    call_chunked('RPUSH', p .. 'queue', records, 1000)
    redis.call('HINCRBY', p .. 'meta', 'message_count', n)
  end
  if #channels > 0 then
    redis.call('PUBLISH', ARGV[3], '')
  end
else
  local t = redis.call('TIME')
  local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + defer
  if #channels == 0 then
    call_chunked('ZADD', KEYS[5], interleave(due, records), 1000)
  end
  for _, c in ipairs(channels) do
    local p = ARGV[1] .. c .. ':'
    call_chunked('HSET', p .. 'msgs', interleave(ids, records), 1000)
    call_chunked('ZADD', p .. 'deferred', interleave(due, ids), 1000)
    redis.call('HINCRBY', p .. 'meta', 'message_count', n)
    redis.call('ZADD', KEYS[6], 'LT', due, ARGV[2] .. '/' .. c)
  end
end
redis.call('HINCRBY', KEYS[2], 'message_count', n)
redis.call('HINCRBY', KEYS[2], 'message_bytes', bytes)
return last
