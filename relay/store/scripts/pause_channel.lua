-- include: news.lua
-- pause_channel: a paused channel keeps taking messages but delivers none (deliver.lua
-- checks the flag); unpausing wakes the brokers' delivery loops of the channel.
--
-- KEYS[1] channel meta   KEYS[2] topic version (news.lua)
-- ARGV[1] 1 to pause, 0 to unpause   ARGV[2] wake pub/sub channel   ARGV[3] channel name
-- ARGV[4] the node keys' prefix (lib/node.lua)
-- Returns CODE.DONE.
local channel_meta, version = KEYS[1], KEYS[2]
local pause, wake, channel, node = ARGV[1] == '1', ARGV[2], ARGV[3], ARGV[4]

if pause then
  redis.call('HSET', channel_meta, 'paused', 1)
else
  redis.call('HDEL', channel_meta, 'paused')
  announce(version, wake, channel, node)
end
return CODE.DONE
