-- include: leave.lua
-- unsubscribe: count one consumer less on this broker; an ephemeral channel whose
-- last consumer (on any broker) left is deleted, and an ephemeral topic with it
-- when that was its last channel.
--
-- KEYS[1] topic channels   KEYS[2] topic meta   KEYS[3] channel consumers
-- KEYS[4] topic due index   KEYS[5..15] the other keys of the channel
-- (keys.CHANNEL_SUFFIXES order, without consumers: KEYS[9] channel meta)
-- ARGV[1] channel name (also its member in the due index)   ARGV[2] broker id
-- ARGV[3] 1 if the channel is ephemeral   ARGV[4] 1 if the topic is ephemeral
-- ARGV[5] the channel's incarnation the consumer joined (subscribe.lua): if the channel
-- was deleted since, the consumer was not counted in the channel there is now
-- Returns CODE.KEPT, CODE.CHANNEL_DELETED, or CODE.TOPIC_DELETED (channel and topic).
local channels, topic_meta, consumers, due_index = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local channel_keys, channel_meta = {unpack(KEYS, 5, 15)}, KEYS[9]
local channel, broker = ARGV[1], ARGV[2]
local channel_ephemeral, topic_ephemeral, incarnation = ARGV[3], ARGV[4], ARGV[5]

if redis.call('HGET', channel_meta, 'incarnation') ~= incarnation then
  return CODE.KEPT
end
if redis.call('HINCRBY', consumers, broker, -1) <= 0 then
  redis.call('HDEL', consumers, broker)
end
return drop_if_unused({channels = channels, topic_meta = topic_meta, due_index = due_index,
                       consumers = consumers, channel_meta = channel_meta, urgent = KEYS[15],
                       others = channel_keys}, channel, channel_ephemeral, topic_ephemeral)
