-- include: leave.lua, inflight.lua, queue.lua, news.lua
-- reap: remove from one channel what a dead broker left (workers/reaper.py): its
-- consumers, then the channel if it is ephemeral and that leaves it without one
-- (as unsubscribe.lua), else its connections' in-flight messages go back to the
-- queue at once. Safe to run again: a second run finds nothing of the broker, nor
-- does a run on a channel that is gone.
--
-- KEYS[1] topic channels   KEYS[2] topic meta   KEYS[3] channel consumers
-- KEYS[4] topic due index   KEYS[5] queue   KEYS[6] inflight   KEYS[7] deferred
-- KEYS[8] msgs   KEYS[9] channel meta   KEYS[10..15] the channel's other keys (urgent
-- last: lib/queue.lua)   KEYS[16] topic version (lib/news.lua)
-- ARGV[1] channel name   ARGV[2] dead broker id   ARGV[3] 1 if the channel is ephemeral
-- ARGV[4] 1 if the topic is ephemeral   ARGV[5] wake pub/sub channel
-- ARGV[6] the node keys' prefix (lib/node.lua)
-- Returns {CODE.KEPT, CODE.CHANNEL_DELETED or CODE.TOPIC_DELETED (channel and topic);
-- messages requeued}.
local channels, topic_meta, consumers, due_index = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local queue, inflight, deferred, msgs = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local channel_meta, version = KEYS[9], KEYS[16]
local channel_keys = {unpack(KEYS, 5, 15)}   -- the channel's keys but consumers
local channel, dead_broker = ARGV[1], ARGV[2]
local channel_ephemeral, topic_ephemeral, wake, node = ARGV[3], ARGV[4], ARGV[5], ARGV[6]

if redis.call('SISMEMBER', channels, channel) == 0 then
  return {CODE.KEPT, 0}
end
redis.call('HDEL', consumers, dead_broker)
local gone = drop_if_unused({channels = channels, topic_meta = topic_meta,
                             due_index = due_index, consumers = consumers,
                             channel_meta = channel_meta, urgent = KEYS[15],
                             others = channel_keys},
                            channel, channel_ephemeral, topic_ephemeral)
if gone ~= CODE.KEPT then
  return {gone, 0}
end
local k = {inflight = inflight, msgs = msgs, deferred = deferred, meta = channel_meta}
local ids, members = holders(k, dead_broker .. ':')
back_to_queue({queue = queue, urgent = KEYS[15], meta = channel_meta}, msgs, ids, true)
release(k, ids, members, true)
local requeued = #ids
if requeued > 0 then
  redis.call('HINCRBY', channel_meta, 'requeue_count', requeued)
  announce(version, wake, channel, node)
end
return {CODE.KEPT, requeued}
