-- due: the scanner's read of many topics' due indexes in one call; reads only.
-- On a cluster all the indexes are on this node, in several slots: the Store loads
-- this script with the flag allow-cross-slot-keys where the server has script flags
-- (7+), and calls it once per slot where it has not. The flag lets a script reach
-- keys of other slots of its node, but not declare them: KEYS[1] only routes the
-- call, and the indexes come in ARGV (reads of a moved slot fail the call, which the
-- scanner then makes again on its next pass).
--
-- KEYS[1] one of the indexes   ARGV[1] now (ms)   ARGV[2] entries per index at most
-- ARGV[3..] the topics' due indexes
-- Returns {index number (1 = ARGV[3]), channel, due ms, ...} for the entries due by now.
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for k = 3, #ARGV do
  local due = redis.call('ZRANGEBYSCORE', ARGV[k], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
  for i = 1, #due, 2 do
    out[#out + 1] = k - 2
    out[#out + 1] = due[i]
    out[#out + 1] = due[i + 1]
  end
end
return out
