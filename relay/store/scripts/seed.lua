-- include: node.lua
-- seed: the node due index (lib/node.lua) made up from the due indexes of topic parts
-- this node serves: each of their entries goes in with ZADD LT, so an entry already
-- there stays where it is lower. A scanner seeds its parts when it starts, reconnects
-- (a restarted Redis, or a node index lost) or sees slots move, and sweeps them all this
-- way, a few each second, as a safety net (workers/scanner.py). The parts'
-- indexes are reached undeclared, as node.lua's keys are; one that a stale slot map
-- puts here but lives on another node is skipped (redis.pcall).
--
-- KEYS[1] the node due index   ARGV the parts' due indexes
-- Returns how many entries were seen.
local node_due = KEYS[1]
local due_indexes = ARGV
local CHUNK = 500

local seen = 0
for _, due_index in ipairs(due_indexes) do
  local entries = redis.pcall('ZRANGE', due_index, 0, -1, 'WITHSCORES')
  if type(entries) == 'table' and not entries.err and #entries > 0 then
    local part = part_of(due_index)
    local args = {}
    for j = 1, #entries, 2 do
      args[#args + 1] = entries[j + 1]
      args[#args + 1] = part .. ' ' .. entries[j]
    end
    for j = 1, #args, 2 * CHUNK do
      redis.call('ZADD', node_due, 'LT', unpack(args, j, math.min(j + 2 * CHUNK - 1, #args)))
    end
    seen = seen + #entries / 2
  end
end
return seen
