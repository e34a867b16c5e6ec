-- include: node.lua
-- versions: a broker's read, in one call per node, of what it could not take from the
-- node news hash (lib/node.lua) alone: the news of parts without a field there (the
-- node field starts from the field `news` of the version key, where news.lua counts what
-- a stale slot map kept from the node hash: HSETNX, 0 for none yet, so the next second
-- finds it there) and
-- the partition counts, placements (partitions.lua), order key rules and priority rules
-- (topic_rule.lua) of topics whose news moved (raising a count, or setting a rule, is
-- news). The version keys are reached undeclared, as node.lua's keys are.
--
-- KEYS[1] the node news hash   ARGV the parts' version keys
-- Returns news, partitions, placement, order key rule, priority rule of each in ARGV
-- order, nil where one is absent.
local node_news = KEYS[1]
local version_keys = ARGV

local out = {}
for i, version in ipairs(version_keys) do
  local part = part_of(version)
  local fields = redis.call('HMGET', version, 'news', 'partitions', 'placement', 'order_key',
                           'priority_rule')
  redis.call('HSETNX', node_news, part, fields[1] or 0)
  out[5 * i - 4], out[5 * i - 3], out[5 * i - 2], out[5 * i - 1], out[5 * i] =
    redis.call('HGET', node_news, part), fields[2], fields[3], fields[4], fields[5]
end
return out
