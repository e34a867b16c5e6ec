-- include: record.lua, queue.lua, order.lua
-- ordered: turn ordered delivery on or off for one part of a channel (relay-admin order,
-- relay/store/ordering.py), and keep the count of the topic's ordered channels, which
-- publish.lua reads to know whether to look at its channels' modes at all (lib/append.lua).
-- Turned on with ARGV[6] = 1 (data layout 3 in force), its messages wait numbered by key
-- in the msgs hash (lib/order.lua): the meta's order_seqs is set.
-- Turned off, the messages waiting behind their keys go out (queued, or deferred until
-- their due time), each key's in order, at most ARGV[5] per call (the caller calls again
-- while some are left, with the cursor returned), and then the gate is gone: what
-- follows is delivered as on any channel. A channel with a depth limit cannot be
-- ordered (a limit counts the queue, which on an ordered channel holds one message per
-- key).
--
-- KEYS[1] topic channels   KEYS[2] topic meta   KEYS[3] channel meta   KEYS[4] queue
-- KEYS[5] deferred   KEYS[6] msgs   KEYS[7] gate   KEYS[8] key_of   KEYS[9] waiting
-- KEYS[10] topic due index   KEYS[11] topic version (lib/news.lua)   KEYS[12] urgent
-- ARGV[1] 1 on, 0 off   ARGV[2] channel   ARGV[3] wake pub/sub channel
-- ARGV[4] the node keys' prefix (lib/node.lua)   ARGV[5] the most waiting messages to
-- send out   ARGV[6] 1: wait numbered by key   ARGV[7] off: the gate's HSCAN cursor ('0'
-- first)
-- Returns {CODE.DONE, messages released, 1 if some are left else 0, the cursor to call
-- again with} done, {CODE.NO_CHANNEL} no such channel, {CODE.LIMITED} the channel has a
-- depth limit.
local channels, topic_meta, channel_meta, queue = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local deferred, msgs, gate, key_of, waiting = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local due_index, version = KEYS[10], KEYS[11]
local q = {queue = queue, urgent = KEYS[12], meta = channel_meta}
local on, channel, wake, node = ARGV[1] == '1', ARGV[2], ARGV[3], ARGV[4]
local most, numbered, cursor = tonumber(ARGV[5]), ARGV[6] == '1', ARGV[7]
local STEP = 1000   -- waiting messages read per ZRANGE

if redis.call('SISMEMBER', channels, channel) == 0 then
  return {CODE.NO_CHANNEL}
end
if on then
  if redis.call('HEXISTS', channel_meta, 'max_depth') == 1 then return {CODE.LIMITED} end
  if redis.call('HSETNX', channel_meta, 'ordered', 1) == 1 then
    redis.call('HINCRBY', topic_meta, 'ordered_channels', 1)
    if numbered and redis.call('EXISTS', waiting) == 0 then
      redis.call('HSET', channel_meta, 'order_seqs', 1)
    end
  end
  return {CODE.DONE, 0, 0, '0'}
end
if redis.call('HDEL', channel_meta, 'ordered') == 1 then
  redis.call('HINCRBY', topic_meta, 'ordered_channels', -1)
end
local now, ready, released, earliest = now_ms(), {}, 0, nil

-- a waiting message out: queued (in `ready`), or deferred until it is due
local function send(id, due, record)
  if due > now then
    redis.call('HSET', msgs, id, record)
    redis.call('ZADD', deferred, due, id)
    if not earliest or due < earliest then earliest = due end
  else
    ready[#ready + 1] = record
  end
end

local seqs, left = redis.call('HGET', channel_meta, 'order_seqs'), 0
if seqs then
  local done = false    -- the scan went round
  repeat
    local reply = redis.call('HSCAN', gate, cursor, 'COUNT', 100)
    local fields, whole = reply[2], true
    for i = 1, #fields, 2 do
      local key = fields[i]
      local id, first, next = split_gate(fields[i + 1])
      if first then
        first = tonumber(first)
        local last = math.min(tonumber(next), first + most - released)  -- past the last sent
        local names = {}
        for seq = first, last - 1 do names[#names + 1] = key .. ' ' .. seq end
        for _, entry in ipairs(hmget_chunked(msgs, names)) do
          if entry then
            send(split_entry(entry))
            released = released + 1
          end
        end
        call_chunked('HDEL', msgs, names)
        redis.call('HSET', gate, key, gate_value(id, last, next))
        enqueue(q, ready)
        ready = {}
      end
      if released >= most then
        whole = false     -- the next call reads this step's keys again, from `cursor`
        break
      end
    end
    if whole then
      cursor = reply[1]
      done = cursor == '0'
    end
  until done or released >= most
  redis.call('HINCRBY', channel_meta, 'order_waiting', -released)
  if done then
    redis.call('HDEL', channel_meta, 'order_seqs', 'order_waiting')
    redis.call('DEL', gate, key_of)
  else
    left = 1
  end
else
  while released < most do
    local members = redis.call('ZRANGE', waiting, 0, math.min(STEP, most - released) - 1)
    if #members == 0 then break end
    for _, member in ipairs(members) do
      local at = string.find(member, ' ', 1, true) + 1
      local space = string.find(member, ' ', at + 17, true)
      send(string.sub(member, at, at + 15), tonumber(string.sub(member, at + 17, space - 1)),
           string.sub(member, space + 1))
    end
    released = released + #members
    enqueue(q, ready)
    ready = {}
    call_chunked('ZREM', waiting, members)
  end
  left = redis.call('EXISTS', waiting)
  if left == 0 then redis.call('DEL', gate, key_of) end
end
if earliest then due_lower(node, due_index, channel, earliest) end
if released > 0 then announce(version, wake, channel, node) end
return {CODE.DONE, released, left, cursor}
