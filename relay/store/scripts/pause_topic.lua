-- include: fanout.lua, chunked.lua, backlog.lua, news.lua
-- pause_topic: a paused topic keeps what is published in its backlog and fans nothing
-- out (publish.lua and subscribe.lua check the flag); unpausing moves the backlog,
-- deferred part included, to every channel and wakes the brokers.
--
-- KEYS[1] topic meta   KEYS[2] topic channels   KEYS[3] backlog   KEYS[4] backlog deferred
-- KEYS[5] topic due index   KEYS[6] topic version (news.lua), then the channels' keys
-- (fanout.lua)
-- ARGV[1..ARG0] the channels (fanout.lua), then: 1 to pause, 0 to unpause,
-- wake pub/sub channel, the node keys' prefix (lib/node.lua)
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
  call_chunked('RPUSH', channel_key(c, 'queue'), records)
  hand_over_deferred(deferred, channel_key(c, 'msgs'), channel_key(c, 'deferred'), KEYS[5],
                     channel_name(c), ARGV[ARG0 + 3])
  redis.call('HINCRBY', channel_key(c, 'meta'), 'message_count', #records + #deferred / 2)
end
redis.call('UNLINK', KEYS[3], KEYS[4])
announce(KEYS[6], ARGV[ARG0 + 2], '', ARGV[ARG0 + 3])
return 1
