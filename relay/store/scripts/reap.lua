-- include: leave.lua, inflight.lua, queue.lua, news.lua
-- reap: remove from one channel what a dead broker left (workers/reaper.py): its
-- consumers, then the channel if it is ephemeral and that leaves it without one
-- (as unsubscribe.lua), else its connections' in-flight messages go back to the
-- queue at once. Safe to run again: a second run finds nothing of the broker, nor
-- does a run on a channel that is gone.
--
-- KEYS[1] topic channels   KEYS[2] topic meta   KEYS[3] channel consumers
-- KEYS[4] topic due index   KEYS[5] queue   KEYS[6] inflight   KEYS[7] deferred
-- KEYS[8] msgs   KEYS[9] channel meta   KEYS[10..14] the channel's other keys
-- KEYS[15] topic version (lib/news.lua)
-- ARGV[1] channel name   ARGV[2] dead broker id   ARGV[3] 1 if the channel is ephemeral
-- ARGV[4] 1 if the topic is ephemeral   ARGV[5] wake pub/sub channel
-- ARGV[6] the node keys' prefix (lib/node.lua)
-- Returns {0 kept, 1 channel deleted, 2 channel and topic deleted; messages requeued}.
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
  return {0, 0}
end
redis.call('HDEL', KEYS[3], ARGV[2])
local gone = drop_if_unused(ARGV[1], ARGV[3], ARGV[4])
if gone > 0 then
  return {gone, 0}
end
local k = {inflight = KEYS[6], msgs = KEYS[8], deferred = KEYS[7]}
local ids, members = holders(k, ARGV[2] .. ':')
back_to_queue(KEYS[5], k.msgs, ids, true)
release(k, ids, members, true)
local requeued = #ids
if requeued > 0 then
  redis.call('HINCRBY', KEYS[9], 'requeue_count', requeued)
  announce(KEYS[15], ARGV[5], ARGV[1], ARGV[6])
end
return {0, requeued}
