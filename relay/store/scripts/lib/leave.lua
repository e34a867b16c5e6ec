-- leave.lua provides drop_if_unused(): after a broker's consumers left a channel (it
-- unsubscribed one, or a reaper removed a dead broker's), an ephemeral channel with no
-- consumer left on any broker is deleted, and an ephemeral topic with its last channel.
-- KEYS are laid out as unsubscribe.lua's: [1] topic channels [2] topic meta
-- [3] channel consumers [4] topic due index [5..14] the other keys of the channel
-- (keys.CHANNEL_SUFFIXES order, without consumers: [9] channel meta).
-- Returns 0 kept, 1 channel deleted, 2 channel and topic deleted.
local function drop_if_unused(channel, channel_ephemeral, topic_ephemeral)
  if channel_ephemeral ~= '1' or redis.call('HLEN', KEYS[3]) > 0 then
    return 0
  end
  redis.call('SREM', KEYS[1], channel)
  redis.call('ZREM', KEYS[4], channel)
  if redis.call('HEXISTS', KEYS[9], 'ordered') == 1 then
    redis.call('HINCRBY', KEYS[2], 'ordered_channels', -1)   -- lib/order.lua
  end
  redis.call('UNLINK', KEYS[3], unpack(KEYS, 5, 14))
  if topic_ephemeral == '1' and redis.call('SCARD', KEYS[1]) == 0 then
    redis.call('UNLINK', KEYS[2])
    return 2
  end
  return 1
end
