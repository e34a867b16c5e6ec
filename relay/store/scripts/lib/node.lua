-- node.lua provides part_of(), node_set() and due_lower(): the writes of
-- the node-level keys (relay/store/nodes.py), one due index and one news hash per Redis
-- node, which scanners and brokers read in one command per node:
--   <node>due   ZSET "<part> <channel>" -> the channel's score in its part's due index
--               (or lower: a lower one only costs the scanner a look)
--   <node>news  HASH part -> the part's news, which announce() bumps (news.lua)
-- `node` is their prefix for the node serving the script's part, given by the caller
-- ("relay:" on one server); nil writes nothing. They are not among KEYS, which a
-- cluster wants in one slot: a script without flags may reach any key of its own node
-- (Redis 6.2, 7, Valkey 8). A write that a stale slot map sent to another node's keys
-- is an error that redis.pcall returns rather than raises: it is skipped, and made up
-- for by the scanners' seeding and sweep and the brokers' read of the version keys.

-- The part a topic key names: its hash tag.
local function part_of(key)
  return string.match(key, '{(.-)}')
end

-- A channel's entry in the node due index set to `due` ms, or removed when nil.
local function node_set(node, due_index, channel, due)
  if not node then return end
  local member = part_of(due_index) .. ' ' .. channel
  if due then
    redis.pcall('ZADD', node .. 'due', due, member)
  else
    redis.pcall('ZREM', node .. 'due', member)
  end
end

-- A channel's entry in its part's due index lowered to `due` ms (added if absent), and
-- in the node due index too when that changed it (node <= part holds already otherwise).
local function due_lower(node, due_index, channel, due)
  if redis.call('ZADD', due_index, 'LT', 'CH', due, channel) == 1 and node then
    redis.pcall('ZADD', node .. 'due', 'LT', due, part_of(due_index) .. ' ' .. channel)
  end
end
