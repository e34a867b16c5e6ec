-- include: finish.lua
-- finish_many: finish.lua's work for the FINs of several channels of one topic part in
-- one call: the group commit merges the finish calls of a pipeline that way (a wide
-- topic's consumers each FIN on their own channel at about the same time).
--
-- KEYS[1] topic due index   KEYS[2] topic version (lib/news.lua), then 7 per channel:
-- inflight, msgs, deferred, queue, gate, key_of, waiting
-- ARGV[1] wake pub/sub channel   ARGV[2] the node keys' prefix (lib/node.lua), then per
-- channel: its name, its count of pairs P, and P pairs: owner, id
-- Returns per channel finish.lua's reply: per pair 1 finished, 0 not in flight (or
-- finished earlier in this call), -1 in flight for another client.
local out = {}
local a = 3
for key = 3, #KEYS, 7 do
  local k = {inflight = KEYS[key], msgs = KEYS[key + 1], deferred = KEYS[key + 2]}
  local o = {queue = KEYS[key + 3], gate = KEYS[key + 4], key_of = KEYS[key + 5],
             waiting = KEYS[key + 6], msgs = KEYS[key + 1], deferred = KEYS[key + 2],
             due_index = KEYS[1], version = KEYS[2],
             channel = ARGV[a], wake = ARGV[1], node = ARGV[2]}
  local last = a + 1 + 2 * tonumber(ARGV[a + 1])
  out[#out + 1] = finish_pairs(k, ARGV, a + 2, last, o)
  a = last + 1
end
return out
