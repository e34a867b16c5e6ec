-- include: chunked.lua, news.lua
-- redrive: put dead letters back at the end of their channel's queue, with their
-- original id and timestamp and attempts reset, and wake the channel's consumers.
--
-- KEYS[1] topic channels   KEYS[2] channel queue   KEYS[3] topic version (news.lua)
-- ARGV[1] channel name   ARGV[2] wake pub/sub channel   ARGV[3] the node keys' prefix
-- (lib/node.lua)   ARGV[4..] records
-- Returns how many were queued, or -1 if the channel does not exist.
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
  return -1
end
call_chunked('RPUSH', KEYS[2], ARGV, 4)
announce(KEYS[3], ARGV[2], ARGV[1], ARGV[3])
return #ARGV - 3
