-- include: news.lua
-- rate: set or remove the delivery rate limit of a channel on one part (relay-admin limit
-- --rate; relay/store/limits.py). Every part's meta holds the rate, so that its deliver
-- calls (lib/deliver.lua) deliver only what a broker took from the bucket first; the
-- bucket itself is part 0's (tokens.lua). Setting or removing it wakes the brokers'
-- delivery loops of the channel: those held back look again at once.
--
-- KEYS[1] topic channels   KEYS[2] channel meta   KEYS[3] topic version (news.lua)
-- ARGV[1] channel   ARGV[2] msgs/s ('' removes the limit)   ARGV[3] burst
-- ARGV[4] wake pub/sub channel   ARGV[5] the node keys' prefix (lib/node.lua)
-- Returns CODE.DONE, or CODE.NO_CHANNEL when the part has no such channel.
local channels, meta, version = KEYS[1], KEYS[2], KEYS[3]
local channel, rate, burst, wake, node = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

if redis.call('SISMEMBER', channels, channel) == 0 then
  return CODE.NO_CHANNEL
end
if rate == '' then
  redis.call('HDEL', meta, 'rate_per_s', 'rate_burst', 'rate_tat')
else
  redis.call('HSET', meta, 'rate_per_s', rate, 'rate_burst', burst)
end
announce(version, wake, channel, node)
return CODE.DONE
