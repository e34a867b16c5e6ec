-- include: fanout.lua, chunked.lua, record.lua, queue.lua, backlog.lua, news.lua
-- pause_topic: a paused topic keeps what is published in its backlog and fans nothing
-- out (publish.lua and subscribe.lua check the flag); unpausing moves the backlog,
-- deferred part included, to every channel and wakes the brokers.
--
-- KEYS[1] topic meta   KEYS[2] topic channels   KEYS[3] backlog   KEYS[4] backlog deferred
-- KEYS[5] topic due index   KEYS[6] topic version (news.lua), then the channels' keys
-- (fanout.lua)
-- ARGV[1..ARG0] the channels (fanout.lua), then: 1 to pause, 0 to unpause,
-- wake pub/sub channel, the node keys' prefix (lib/node.lua)
-- Returns CODE.DONE, or the stale reply.
fanout_begin()
local topic_meta, channels, backlog, backlog_deferred = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local due_index, version = KEYS[5], KEYS[6]
local pause, wake, node = ARGV[ARG0 + 1] == '1', ARGV[ARG0 + 2], ARGV[ARG0 + 3]

if pause then
  redis.call('HSET', topic_meta, 'paused', 1)
  return CODE.DONE
end
local stale = stale_channels(channels)
if stale then return stale end
redis.call('HDEL', topic_meta, 'paused')
if N_CHANNELS == 0 then
  return CODE.DONE
end
local records = redis.call('LRANGE', backlog, 0, -1)
local deferred = redis.call('ZRANGE', backlog_deferred, 0, -1, 'WITHSCORES')
for c = 1, N_CHANNELS do
  enqueue({queue = channel_key(c, 'queue'), urgent = channel_key(c, 'urgent'),
           meta = channel_key(c, 'meta')}, records)
  hand_over_deferred(deferred, channel_key(c, 'msgs'), channel_key(c, 'deferred'), due_index,
                     channel_name(c), node)
  redis.call('HINCRBY', channel_key(c, 'meta'), 'message_count', #records + #deferred / 2)
end
redis.call('UNLINK', backlog, backlog_deferred)
redis.call('HDEL', topic_meta, 'urgent_backlog')
announce(version, wake, '', node)
return CODE.DONE
