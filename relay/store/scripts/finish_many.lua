-- include: finish.lua
-- finish_many: finish.lua's work for the FINs of several channels of one topic part in
-- one call: the group commit merges the finish calls of a pipeline that way (a wide
-- topic's consumers each FIN on their own channel at about the same time).
--
-- KEYS[1] topic due index   KEYS[2] topic version (lib/news.lua), then 9 per channel:
-- inflight, msgs, deferred, queue, gate, key_of, waiting, meta, urgent
-- ARGV[1] wake pub/sub channel   ARGV[2] the node keys' prefix (lib/node.lua), then per
-- channel: its name, its count of pairs P, and P pairs: owner, id
-- Returns per channel finish.lua's reply: per pair CODE.DONE finished,
-- CODE.NOT_IN_FLIGHT not in flight (or finished earlier in this call), CODE.NOT_OWNER
-- in flight for another client.
local due_index, version = KEYS[1], KEYS[2]
local FIRST_CHANNEL_KEY, KEYS_PER_CHANNEL = 3, 9
local wake, node = ARGV[1], ARGV[2]
local FIRST_CHANNEL_ARG = 3

local out = {}
local a = FIRST_CHANNEL_ARG
for key = FIRST_CHANNEL_KEY, #KEYS, KEYS_PER_CHANNEL do
  local inflight, msgs, deferred, queue, gate, key_of, waiting, meta, urgent =
      unpack(KEYS, key, key + KEYS_PER_CHANNEL - 1)
  local channel, pair_count = ARGV[a], tonumber(ARGV[a + 1])
  local k = {inflight = inflight, msgs = msgs, deferred = deferred, meta = meta}
  local o = order_gate(queue, deferred, msgs, meta, gate, key_of, waiting, urgent,
                       due_index, version, channel, wake, node)
  local last = a + 1 + 2 * pair_count
  out[#out + 1] = finish_pairs(k, ARGV, a + 2, last, o)
  a = last + 1
end
return out
