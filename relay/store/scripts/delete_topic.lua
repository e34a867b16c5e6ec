-- delete_topic: remove a topic, its backlog and all its channels. The id counter
-- stays, so a topic created again never reuses a message id.
--
-- KEYS[1] topic meta   KEYS[2] topic channels   KEYS[3] backlog   KEYS[4] backlog deferred
-- KEYS[5] scanners' due index
-- ARGV[1] channel key prefix   ARGV[2] topic name   ARGV[3..] channel key suffixes
-- Returns the number of channels deleted.
local channels = redis.call('SMEMBERS', KEYS[2])
for _, c in ipairs(channels) do
  local p = ARGV[1] .. c .. ':'
  for i = 3, #ARGV do
    redis.call('UNLINK', p .. ARGV[i])
  end
  redis.call('ZREM', KEYS[5], ARGV[2] .. '/' .. c)
end
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return #channels
