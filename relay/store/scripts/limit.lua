-- limit: set or remove the depth limit of one part of a channel (relay-admin limit),
-- and keep the count of the topic's limited channels, which publish.lua reads to know
-- whether to look at its channels' limits at all (lib/limit.lua).
--
-- KEYS[1] topic channels   KEYS[2] topic meta   KEYS[3] channel meta
-- ARGV[1] channel   ARGV[2] max depth as set ('' removes the limit)   ARGV[3] this part's
-- share of it   ARGV[4] overflow (reject, drop-oldest or dead-letter)
-- Returns CODE.DONE, CODE.NO_CHANNEL when there is no such channel, or CODE.ORDERED when
-- it is ordered (lib/order.lua: a limit counts the queue, which there holds one message
-- per key).
local channels, topic_meta, channel_meta = KEYS[1], KEYS[2], KEYS[3]
local channel, max_depth, part_max_depth, overflow = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if redis.call('SISMEMBER', channels, channel) == 0 then
  return CODE.NO_CHANNEL
end
if max_depth ~= '' and redis.call('HEXISTS', channel_meta, 'ordered') == 1 then
  return CODE.ORDERED
end
local had = redis.call('HEXISTS', channel_meta, 'max_depth') == 1
if max_depth == '' then
  redis.call('HDEL', channel_meta, 'max_depth', 'part_max_depth', 'overflow')
  if had then redis.call('HINCRBY', topic_meta, 'limited_channels', -1) end
else
  redis.call('HSET', channel_meta, 'max_depth', max_depth, 'part_max_depth', part_max_depth,
             'overflow', overflow)
  if not had then redis.call('HINCRBY', topic_meta, 'limited_channels', 1) end
end
return CODE.DONE
