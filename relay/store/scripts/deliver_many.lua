-- include: deliver.lua
-- deliver_many: deliver_channel() (lib/deliver.lua) for each of several channels of one
-- topic part, in one call: a wake-up of a topic with many channels on this broker costs
-- a call per bounded group of channels (relay/broker/channel.py), not one per channel.
--
-- KEYS[1] topic due index   KEYS[2] topic version, then 9 per channel: queue, inflight,
-- msgs, meta, dead-letter outbox, deferred, gate, key_of, waiting
-- ARGV[1] max attempts (0: unlimited)   ARGV[2] wake pub/sub channel   ARGV[3] the node
-- keys' prefix (node.lua), then per channel: its name, its count of groups G, and G
-- groups of 4 as deliver.lua's
-- Returns per channel what deliver.lua returns with no FINs folded in: one list of
-- records per group, the count of empties, {} (no finish codes), 1 if more else 0.

local out = {}
local a = 4
for key = 3, #KEYS, 9 do
  local c = {queue = KEYS[key], inflight = KEYS[key + 1], msgs = KEYS[key + 2],
             meta = KEYS[key + 3], dead = KEYS[key + 4], deferred = KEYS[key + 5],
             gate = KEYS[key + 6], key_of = KEYS[key + 7], waiting = KEYS[key + 8],
             due_index = KEYS[1], version = KEYS[2],
             channel = ARGV[a], wake = ARGV[2], node = ARGV[3]}
  local first = a + 2
  local last = first + 4 * tonumber(ARGV[a + 1]) - 1
  local records, empties, more = deliver_channel(c, ARGV[1], ARGV, first, last)
  records[#records + 1] = empties
  records[#records + 1] = {}
  records[#records + 1] = more
  out[#out + 1] = records
  a = last + 1
end
return out
