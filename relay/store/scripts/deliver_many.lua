-- include: deliver.lua
-- deliver_many: deliver_channel() (lib/deliver.lua) for each of several channels of one
-- topic part, in one call: a wake-up of a topic with many channels on this broker costs
-- a call per bounded group of channels (relay/broker/channel.py), not one per channel.
--
-- KEYS[1] topic due index   KEYS[2] topic version, then 10 per channel: queue, inflight,
-- msgs, meta, dead-letter outbox, deferred, gate, key_of, waiting, urgent
-- ARGV[1] max attempts (0: unlimited)   ARGV[2] 1 if lots may be written (deliver.lua)
-- ARGV[3] wake pub/sub channel   ARGV[4] the node keys' prefix (node.lua), then per
-- channel: its name, 1 if its counts were taken from
-- its rate limit else 0 (deliver.lua), its count of groups G, and G groups of 4 as
-- deliver.lua's
-- Returns per channel what deliver.lua returns with no FINs folded in: one list of
-- records per group, the count of empties, {} (no finish codes), 1 if more else 0, 1 if
-- ordered else 0, 1 if rate-limited else 0, the groups' lot names (deliver.lua).
local due_index, version = KEYS[1], KEYS[2]
local FIRST_CHANNEL_KEY, KEYS_PER_CHANNEL = 3, 10
local max_attempts, lots, wake, node = ARGV[1], ARGV[2] == '1', ARGV[3], ARGV[4]
local FIRST_CHANNEL_ARG = 5

local out = {}
local a = FIRST_CHANNEL_ARG
for key = FIRST_CHANNEL_KEY, #KEYS, KEYS_PER_CHANNEL do
  local queue, inflight, msgs, meta, dead, deferred, gate, key_of, waiting, urgent =
      unpack(KEYS, key, key + KEYS_PER_CHANNEL - 1)
  local channel, taken, group_count = ARGV[a], ARGV[a + 1] == '1', tonumber(ARGV[a + 2])
  local c = order_gate(queue, deferred, msgs, meta, gate, key_of, waiting, urgent,
                       due_index, version, channel, wake, node)
  c.inflight, c.dead = inflight, dead
  local first = a + 3
  local last = first + 4 * group_count - 1
  local records, empties, more, ordered, limited, lot_names = deliver_channel(
      c, max_attempts, ARGV, first, last, taken, lots)
  records[#records + 1] = empties
  records[#records + 1] = {}
  records[#records + 1] = more
  records[#records + 1] = ordered
  records[#records + 1] = limited
  records[#records + 1] = lot_names
  out[#out + 1] = records
  a = last + 1
end
return out
