-- include: fanout.lua, chunked.lua, record.lua, queue.lua, backlog.lua, news.lua
-- pause_topic: a paused topic keeps what is published in its backlog and fans nothing
-- out (publish.lua and subscribe.lua check the flag); unpausing moves the backlog,
-- deferred part included, to every channel and wakes the brokers.
-- An unpause moves the backlog a step at a time, from its head: a call holds Redis for
-- no more than STEP records times the channels, whatever the backlog's size (a whole
-- backlog read by one call held every client for seconds, and its copy in Lua memory).
-- Until the last step the topic stays paused, its flag UNPAUSING (lib/backlog.lua), so
-- what is published meanwhile goes behind the rest; each step wakes the brokers, whose
-- consumers start on what moved. A pause between two steps stops the unpause there.
--
-- KEYS[1] topic meta   KEYS[2] topic channels   KEYS[3] backlog   KEYS[4] backlog deferred
-- KEYS[5] topic due index   KEYS[6] topic version (news.lua), then the channels' keys
-- (fanout.lua)
-- ARGV[1..ARG0] the channels (fanout.lua), then: 1 to pause, 0 to unpause, `step` for
-- an unpause's next step, wake pub/sub channel, the node keys' prefix (lib/node.lua)
-- Returns CODE.DONE, CODE.MORE (an unpause with more to move: call again with `step`),
-- or the stale reply.
fanout_begin()
local topic_meta, channels, backlog, backlog_deferred = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local due_index, version = KEYS[5], KEYS[6]
local mode, wake, node = ARGV[ARG0 + 1], ARGV[ARG0 + 2], ARGV[ARG0 + 3]
local STEP = 10000          -- records moved per call, over all channels

if mode == '1' then
  redis.call('HSET', topic_meta, 'paused', 1)
  return CODE.DONE
end
if mode == 'step' and redis.call('HGET', topic_meta, 'paused') ~= UNPAUSING then
  return CODE.DONE    -- paused again, or unpaused by another call
end
local stale = stale_channels(channels)
if stale then return stale end
if N_CHANNELS == 0 then
  redis.call('HDEL', topic_meta, 'paused')
  return CODE.DONE
end
local step = math.max(1, math.floor(STEP / N_CHANNELS))
local records = redis.call('LRANGE', backlog, 0, step - 1)
local deferred = redis.call('ZRANGE', backlog_deferred, 0, step - 1, 'WITHSCORES')
for c = 1, N_CHANNELS do
  enqueue({queue = channel_key(c, 'queue'), urgent = channel_key(c, 'urgent'),
           meta = channel_key(c, 'meta')}, records)
  hand_over_deferred(deferred, channel_key(c, 'msgs'), channel_key(c, 'deferred'), due_index,
                     channel_name(c), node)
  redis.call('HINCRBY', channel_key(c, 'meta'), 'message_count', #records + #deferred / 2)
end
if #records > 0 then redis.call('LTRIM', backlog, #records, -1) end
if #deferred > 0 then redis.call('ZREMRANGEBYRANK', backlog_deferred, 0, #deferred / 2 - 1) end
if redis.call('EXISTS', backlog, backlog_deferred) > 0 then
  redis.call('HSET', topic_meta, 'paused', UNPAUSING)
  announce(version, wake, '', node)
  return CODE.MORE
end
redis.call('HDEL', topic_meta, 'paused', 'urgent_backlog')
announce(version, wake, '', node)
return CODE.DONE
