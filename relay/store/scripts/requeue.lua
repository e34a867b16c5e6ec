-- include: time.lua, inflight.lua, queue.lua, news.lua, node.lua
-- requeue: put messages their owner gave back (REQ, the connection closed, or
-- relay-admin requeue naming the holder) at the tail of the queue, or deferred for a
-- while.
--
-- KEYS[1] queue   KEYS[2] inflight   KEYS[3] msgs   KEYS[4] deferred   KEYS[5] channel meta
-- KEYS[6] topic due index   KEYS[7] topic version (news.lua)   KEYS[8] urgent (lib/queue.lua)
-- ARGV[1] channel name (also its member in the due index)   ARGV[2] wake pub/sub channel
-- ARGV[3] the node keys' prefix (node.lua), then triples: owner, id (or lot item:
-- lib/inflight.lua), delay ms
-- Returns per triple: CODE.DONE requeued, CODE.NOT_IN_FLIGHT not in flight (or requeued
-- earlier in this call), CODE.NOT_OWNER in flight for another client.
local queue, inflight, msgs, deferred = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local channel_meta, due_index, version = KEYS[5], KEYS[6], KEYS[7]
local channel, wake, node = ARGV[1], ARGV[2], ARGV[3]
local q = {queue = queue, urgent = KEYS[8], meta = channel_meta}
local FIRST_TRIPLE = 4

local k = {inflight = inflight, msgs = msgs, deferred = deferred, meta = channel_meta}
local now = now_ms()
unlot(k, ARGV, FIRST_TRIPLE, #ARGV, 3)
local held, codes = holdings(k, ARGV, FIRST_TRIPLE, #ARGV, 3)
local out = {}
local requeued, taken = 0, {}
local ready, ready_members = {}, {}
local delayed, delayed_members = {}, {}
for n, member in ipairs(held) do
  local i = FIRST_TRIPLE + 3 * (n - 1)
  local id, delay = ARGV[i + 1], tonumber(ARGV[i + 2])
  if not member or taken[id] then
    out[n] = member and CODE.NOT_IN_FLIGHT or codes[n]
  else
    taken[id] = true
    local ids, members = ready, ready_members
    if delay > 0 then
      ids, members = delayed, delayed_members
      redis.call('ZADD', deferred, now + delay, id)
      due_lower(node, due_index, channel, now + delay)
    end
    ids[#ids + 1] = id
    members[#ids] = member
    requeued = requeued + 1
    out[n] = CODE.DONE
  end
end
if #delayed > 0 then
  count_delivery(msgs, delayed)
  release(k, delayed, delayed_members, true)
end
if #ready > 0 then
  back_to_queue(q, msgs, ready, true)
  release(k, ready, ready_members, true)
end
if requeued > 0 then
  redis.call('HINCRBY', channel_meta, 'requeue_count', requeued)
end
if #ready > 0 then
  announce(version, wake, channel, node)
end
return out
