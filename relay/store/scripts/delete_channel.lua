-- delete_channel: remove a channel and everything in it.
--
-- KEYS[1] topic channels   KEYS[2] scanners' due index   KEYS[3..] the channel's keys
-- ARGV[1] channel name   ARGV[2] due member
-- Returns 1 if deleted, 0 if there was no such channel.
if redis.call('SREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('UNLINK', unpack(KEYS, 3))
return 1
