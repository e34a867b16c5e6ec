-- pause_topic: a paused topic keeps what is published in its backlog and fans nothing
-- out (publish.lua and subscribe.lua check the flag); unpausing moves the backlog,
-- deferred part included, to every channel and wakes the brokers.
--
-- KEYS[1] topic meta   KEYS[2] topic channels   KEYS[3] backlog   KEYS[4] backlog deferred
-- KEYS[5] scanners' due index
-- ARGV[1] 1 to pause, 0 to unpause   ARGV[2] channel key prefix   ARGV[3] topic name
-- ARGV[4] wake pub/sub channel
if ARGV[1] == '1' then
  redis.call('HSET', KEYS[1], 'paused', 1)
  return 1
end
redis.call('HDEL', KEYS[1], 'paused')
local channels = redis.call('SMEMBERS', KEYS[2])
if #channels == 0 then
  return 1
end
local records = redis.call('LRANGE', KEYS[3], 0, -1)
local deferred = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
for _, c in ipairs(channels) do
  local p = ARGV[2] .. c .. ':'
  for i = 1, #records, 1000 do
    redis.call('RPUSH', p .. 'queue', unpack(records, i, math.min(i + 999, #records)))
  end
  for i = 1, #deferred, 2 do
    local record, due = deferred[i], deferred[i + 1]
    local id = string.sub(record, 11, 26)
    redis.call('HSET', p .. 'msgs', id, record)
    redis.call('ZADD', p .. 'deferred', due, id)
    redis.call('ZADD', KEYS[5], 'LT', due, ARGV[3] .. '/' .. c)
  end
  redis.call('HINCRBY', p .. 'meta', 'message_count', #records + #deferred / 2)
end
redis.call('UNLINK', KEYS[3], KEYS[4])
redis.call('PUBLISH', ARGV[4], '')
return 1
