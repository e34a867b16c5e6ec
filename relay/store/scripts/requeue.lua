-- include: time.lua, inflight.lua, queue.lua, news.lua, node.lua, maxmemory.lua
-- requeue: put messages their owner gave back (REQ, the connection closed, or
-- relay-admin requeue naming the holder) at the tail of the queue, or deferred for a
-- while.
--
-- KEYS[1] queue   KEYS[2] inflight   KEYS[3] msgs   KEYS[4] deferred   KEYS[5] channel meta
-- KEYS[6] topic due index   KEYS[7] topic version (news.lua)
-- ARGV[1] channel name (also its member in the due index)   ARGV[2] wake pub/sub channel
-- ARGV[3] the node keys' prefix (node.lua), then triples: owner, id, delay ms
-- Returns per triple: 1 requeued, 0 not in flight, -1 in flight for another client.
past_maxmemory()
local k = {inflight = KEYS[2], msgs = KEYS[3], deferred = KEYS[4]}
local now = now_ms()
local held, codes = holdings(k, ARGV, 4, #ARGV, 3)
local out = {}
local requeued, taken = 0, {}
local ready, ready_members = {}, {}
local deferred, deferred_members = {}, {}
for n, member in ipairs(held) do
  local i = 4 + 3 * (n - 1)
  local id, delay = ARGV[i + 1], tonumber(ARGV[i + 2])
  if not member or taken[id] then
    out[n] = member and 0 or codes[n]
  else
    taken[id] = true
    local ids, members = ready, ready_members
    if delay > 0 then
      ids, members = deferred, deferred_members
      redis.call('ZADD', k.deferred, now + delay, id)
      due_lower(ARGV[3], KEYS[6], ARGV[1], now + delay)
    end
    ids[#ids + 1] = id
    members[#ids] = member
    requeued = requeued + 1
    out[n] = 1
  end
end
if #deferred > 0 then
  count_delivery(k.msgs, deferred)
  release(k, deferred, deferred_members, true)
end
if #ready > 0 then
  back_to_queue(KEYS[1], k.msgs, ready, true)
  release(k, ready, ready_members, true)
end
if requeued > 0 then
  redis.call('HINCRBY', KEYS[5], 'requeue_count', requeued)
end
if #ready > 0 then
  announce(KEYS[7], ARGV[2], ARGV[1], ARGV[3])
end
return out
