-- limit: set or remove the depth limit of one part of a channel (relay-admin limit),
-- and keep the count of the topic's limited channels, which publish.lua reads to know
-- whether to look at its channels' limits at all (lib/limit.lua).
--
-- KEYS[1] topic channels   KEYS[2] topic meta   KEYS[3] channel meta
-- ARGV[1] channel   ARGV[2] max depth as set ('' removes the limit)   ARGV[3] this part's
-- share of it   ARGV[4] overflow (reject, drop-oldest or dead-letter)
-- Returns 1, 0 when there is no such channel, or -1 when it is ordered (lib/order.lua:
-- a limit counts the queue, which there holds one message per key).
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
  return 0
end
if ARGV[2] ~= '' and redis.call('HEXISTS', KEYS[3], 'ordered') == 1 then
  return -1
end
local had = redis.call('HEXISTS', KEYS[3], 'max_depth') == 1
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[3], 'max_depth', 'part_max_depth', 'overflow')
  if had then redis.call('HINCRBY', KEYS[2], 'limited_channels', -1) end
else
  redis.call('HSET', KEYS[3], 'max_depth', ARGV[2], 'part_max_depth', ARGV[3],
             'overflow', ARGV[4])
  if not had then redis.call('HINCRBY', KEYS[2], 'limited_channels', 1) end
end
return 1
