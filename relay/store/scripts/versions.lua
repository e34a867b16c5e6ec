-- include: node.lua
-- versions: a broker's read of the version keys' `news` (news.lua) and partition counts
-- (partitions.lua) of topic parts, in one call per node, for the parts it could not
-- take from the node news hash (lib/node.lua): those without a field there (no news
-- since the layout before, or a write a stale slot map sent elsewhere) and topics whose
-- count may have moved (news on part 0). Each part's news is set in the node hash where
-- it has none (HSETNX; 0 for none yet), so the next second finds it there. The version
-- keys are reached undeclared, as node.lua's keys are.
--
-- KEYS[1] the node news hash   ARGV the parts' version keys
-- Returns news, partitions of each in ARGV order, nil where a key or field is absent.
local out = {}
for i = 1, #ARGV do
  local fields = redis.call('HMGET', ARGV[i], 'news', 'partitions')
  out[2 * i - 1], out[2 * i] = fields[1], fields[2]
  redis.call('HSETNX', KEYS[1], part_of(ARGV[i]), fields[1] or 0)
end
return out
