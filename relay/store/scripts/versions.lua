-- versions: a broker's read of the version keys' `news` (news.lua) of the topics it
-- serves, and of their partition counts (partitions.lua), in one call per node; reads
-- only. On a cluster the keys reach other slots of the node as due.lua's do, with the
-- same flag and the same fallback (one call per slot).
--
-- KEYS[1] one of the version keys   ARGV the topics' version keys
-- Returns news, partitions of each in ARGV order, nil where a key or field is absent.
local out = {}
for i = 1, #ARGV do
  local fields = redis.call('HMGET', ARGV[i], 'news', 'partitions')
  out[2 * i - 1], out[2 * i] = fields[1], fields[2]
end
return out
