-- include: leave.lua, maxmemory.lua
-- unsubscribe: count one consumer less on this broker; an ephemeral channel whose
-- last consumer (on any broker) left is deleted, and an ephemeral topic with it
-- when that was its last channel.
--
-- KEYS[1] topic channels   KEYS[2] topic meta   KEYS[3] channel consumers
-- KEYS[4] topic due index   KEYS[5..] the other keys of the channel
-- ARGV[1] channel name (also its member in the due index)   ARGV[2] broker id
-- ARGV[3] 1 if the channel is ephemeral   ARGV[4] 1 if the topic is ephemeral
-- ARGV[5] the channel's incarnation the consumer joined (subscribe.lua): if the channel
-- was deleted since, the consumer was not counted in the channel there is now
-- Returns 0 kept, 1 channel deleted, 2 channel and topic deleted.
if redis.call('HGET', KEYS[9], 'incarnation') ~= ARGV[5] then
  return 0
end
past_maxmemory()
if redis.call('HINCRBY', KEYS[3], ARGV[2], -1) <= 0 then
  redis.call('HDEL', KEYS[3], ARGV[2])
end
return drop_if_unused(ARGV[1], ARGV[3], ARGV[4])
