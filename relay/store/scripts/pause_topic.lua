-- include: fanout.lua
-- pause_topic: a paused topic keeps what is published in its backlog and fans nothing
-- out (publish.lua and subscribe.lua check the flag); unpausing moves the backlog,
-- deferred part included, to every channel and wakes the brokers.
--
-- KEYS[1] topic meta   KEYS[2] topic channels   KEYS[3] backlog   KEYS[4] backlog deferred
-- KEYS[5] topic due index, then the channels' keys (fanout.lua)
-- ARGV[1..ARG0] the channels (fanout.lua), then: 1 to pause, 0 to unpause,
-- wake pub/sub channel
-- Returns 1, or the stale reply.
if ARGV[ARG0 + 1] == '1' then
  redis.call('HSET', KEYS[1], 'paused', 1)
  return 1
end
local stale = stale_channels(KEYS[2])
if stale then return stale end
redis.call('HDEL', KEYS[1], 'paused')
if N_CHANNELS == 0 then
  return 1
end
local records = redis.call('LRANGE', KEYS[3], 0, -1)
local deferred = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
for c = 1, N_CHANNELS do
  for i = 1, #records, 1000 do
    redis.call('RPUSH', channel_key(c, 'queue'), unpack(records, i, math.min(i + 999, #records)))
  end
  for i = 1, #deferred, 2 do
    local record, due = deferred[i], deferred[i + 1]
    local id = string.sub(record, 11, 26)
    redis.call('HSET', channel_key(c, 'msgs'), id, record)
    redis.call('ZADD', channel_key(c, 'deferred'), due, id)
    redis.call('ZADD', KEYS[5], 'LT', due, channel_name(c))
  end
  redis.call('HINCRBY', channel_key(c, 'meta'), 'message_count', #records + #deferred / 2)
end
redis.call('UNLINK', KEYS[3], KEYS[4])
redis.call('PUBLISH', ARGV[ARG0 + 2], '')
return 1
