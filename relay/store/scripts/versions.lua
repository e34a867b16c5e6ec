-- versions: a broker's read of the version keys' `news` (news.lua) of the topics it serves,
-- in one call per node; reads only. On a cluster the keys reach other slots of the
-- node as due.lua's do, with the same flag and the same fallback (one call per slot).
--
-- KEYS[1] one of the version keys   ARGV the topics' version keys
-- Returns their values in ARGV order, nil for a key that does not exist.
local out = {}
for i = 1, #ARGV do
  out[i] = redis.call('HGET', ARGV[i], 'news')
end
return out
