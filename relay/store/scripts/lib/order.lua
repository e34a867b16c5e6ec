-- include: chunked.lua, time.lua, news.lua
-- order.lua provides the gate of ordered channels (relay-admin order; relay/store/
-- ordering.py): order_gate() to name a channel's, order_admit() for messages published
-- to one, order_release() for messages that leave one. On an ordered channel each order
-- key has at most one message out (queued, in flight or deferred): the gate hash maps
-- the key to its id, key_of the id to its key. The messages behind it wait in the
-- waiting ZSET, all at score 0, as "<order key> <id> <due ms, 0: now> <record>": a key's
-- in id order, which is its publish order (a key always goes to the same part). A REQ or
-- a timeout keeps a message out, so it stays first for its key; every other exit (FIN,
-- dead letter, TTL, delete) releases the key: its next message goes out (queued, or
-- deferred until its due time), else the key leaves the gate, so a key with nothing out
-- costs nothing.
-- The queue only holds messages free to go: deliver.lua pops it as any channel's.
-- o: the channel's gate, as order_gate() builds it.

-- The gate of one channel (o): its keys queue, deferred, msgs, gate, key_of and waiting
-- (keys.CHANNEL_SUFFIXES order), and for what goes out when a key is released its
-- topic's due index and version keys, the channel's name, its wake pub/sub channel and
-- the node keys' prefix (lib/node.lua). order_admit() needs the channel's keys alone.
local function order_gate(queue, deferred, msgs, gate, key_of, waiting, due_index, version,
                          channel, wake, node)
  return {queue = queue, deferred = deferred, msgs = msgs, gate = gate, key_of = key_of,
          waiting = waiting, due_index = due_index, version = version, channel = channel,
          wake = wake, node = node}
end

-- Of messages published to an ordered channel (`ids`, `records`, `order_keys`: a key
-- or false each), those that go out now: {ids}, {records}. The others wait, with their
-- `due` (ms, 0: now).
local function order_admit(o, ids, records, order_keys, due)
  local wanted = {}
  for i = 1, #ids do
    if order_keys[i] then wanted[#wanted + 1] = order_keys[i] end
  end
  if #wanted == 0 then return ids, records end
  local out, n = {}, 0     -- key -> true while it has a message out
  for _, reply in ipairs(call_chunked('HMGET', o.gate, wanted)) do
    for _, id in ipairs(reply) do
      n = n + 1
      if id then out[wanted[n]] = true end
    end
  end
  local free_ids, free_records, gate, key_of, waiting = {}, {}, {}, {}, {}
  for i, id in ipairs(ids) do
    local key = order_keys[i]
    if key and out[key] then
      waiting[#waiting + 1] = 0
      waiting[#waiting + 1] = key .. ' ' .. id .. ' ' .. due .. ' ' .. records[i]
    else
      if key then
        out[key] = true
        gate[#gate + 1], gate[#gate + 2] = key, id
        key_of[#key_of + 1], key_of[#key_of + 2] = id, key
      end
      free_ids[#free_ids + 1], free_records[#free_records + 1] = id, records[i]
    end
  end
  if #gate > 0 then
    call_chunked('HSET', o.gate, gate)
    call_chunked('HSET', o.key_of, key_of)
  end
  if #waiting > 0 then call_chunked('ZADD', o.waiting, waiting) end
  return free_ids, free_records
end

-- The next waiting message of `key` as {id, due ms, record, member}, or nil.
local function next_waiting(o, key)
  local member = redis.call('ZRANGEBYLEX', o.waiting, '[' .. key .. ' ', '(' .. key .. '!',
                            'LIMIT', 0, 1)[1]
  if not member then return nil end
  local at = #key + 2
  local space = string.find(member, ' ', at + 17, true)
  return {string.sub(member, at, at + 15), tonumber(string.sub(member, at + 17, space - 1)),
          string.sub(member, space + 1), member}
end

-- The keys of `ids`, messages that left the channel, released: each key's next message
-- goes out (a wake-up when the queue was empty), else the key leaves the gate. Returns
-- how many were queued. A channel with no key out pays one EXISTS.
local function order_release(o, ids)
  if #ids == 0 or redis.call('EXISTS', o.key_of) == 0 then return 0 end
  local left, order_keys, n = {}, {}, 0
  for _, reply in ipairs(call_chunked('HMGET', o.key_of, ids)) do
    for _, key in ipairs(reply) do
      n = n + 1
      if key then left[#left + 1], order_keys[#order_keys + 1] = ids[n], key end
    end
  end
  if #left == 0 then return 0 end
  call_chunked('HDEL', o.key_of, left)
  local now = now_ms()
  local gone, gate, key_of, members, ready, later, earliest = {}, {}, {}, {}, {}, {}, nil
  for _, key in ipairs(order_keys) do
    local nxt = next_waiting(o, key)
    if nxt then
      local id, due, record = nxt[1], nxt[2], nxt[3]
      members[#members + 1] = nxt[4]
      gate[#gate + 1], gate[#gate + 2] = key, id
      key_of[#key_of + 1], key_of[#key_of + 2] = id, key
      if due > now then
        later[#later + 1] = {id, record, due}
        if not earliest or due < earliest then earliest = due end
      else
        ready[#ready + 1] = record
      end
    else
      gone[#gone + 1] = key
    end
  end
  if #gone > 0 then call_chunked('HDEL', o.gate, gone) end
  if #members == 0 then return 0 end
  call_chunked('ZREM', o.waiting, members)
  call_chunked('HSET', o.gate, gate)
  call_chunked('HSET', o.key_of, key_of)
  for _, m in ipairs(later) do
    redis.call('HSET', o.msgs, m[1], m[2])
    redis.call('ZADD', o.deferred, m[3], m[1])
  end
  if earliest then due_lower(o.node, o.due_index, o.channel, earliest) end
  if #ready > 0 then
    local length = call_chunked('RPUSH', o.queue, ready)
    if length[#length] == #ready then announce(o.version, o.wake, o.channel, o.node) end
  end
  return #ready
end
