-- include: chunked.lua, time.lua, news.lua, record.lua
-- order.lua provides the gate of ordered channels (relay-admin order; relay/store/
-- ordering.py): order_gate() to name a channel's, order_admit() for messages published
-- to one, order_release() for messages that leave one. On an ordered channel each order
-- key has at most one message out (queued, in flight or deferred): the gate hash maps
-- the key to its id, key_of the id to its key. A REQ or a timeout keeps a message out,
-- so it stays first for its key; every other exit (FIN, dead letter, TTL, delete)
-- releases the key: its next message goes out (queued, or deferred until its due
-- time), else the key leaves the gate, so a key with nothing out costs nothing.
-- The messages behind a key wait in one of two shapes, by the channel meta's field
-- `order_lists` (relay/store/layout.py):
-- * set (data layout 3): one LIST per key, `<gate>:<order_lists>:<order key>`, of
--   entries in publish order, each the record as it will be queued, or for one due
--   later "<due ms> <record>" (a record starts with a byte of 128 or more, a digit does
--   not). A release is one LPOP per key, and the count of them all is the meta's
--   `order_waiting`. The field's value, a stamp, is new with each gate, so an emptied
--   or deleted channel's lists, which the trash frees later, are not a new one's.
-- * absent (data layout 2): one ZSET `waiting`, all at score 0, of "<order key> <id>
--   <due ms, 0: now> <record>": a key's in id order, which is its publish order (a key
--   always goes to the same part); a release is one ZRANGEBYLEX per key.
-- The queue only holds messages free to go: deliver.lua pops it as any channel's.
-- o: the channel's gate, as order_gate() builds it.

-- The gate of one channel (o): its keys queue, deferred, msgs, meta, gate, key_of and
-- waiting, and for what goes out when a key is released its topic's due index and
-- version keys, the channel's name, its wake pub/sub channel and the node keys' prefix
-- (lib/node.lua). order_admit() needs the channel's keys alone.
local function order_gate(queue, deferred, msgs, meta, gate, key_of, waiting, due_index,
                          version, channel, wake, node)
  return {queue = queue, deferred = deferred, msgs = msgs, meta = meta, gate = gate,
          key_of = key_of, waiting = waiting, due_index = due_index, version = version,
          channel = channel, wake = wake, node = node}
end

-- A trashed gate's fields naming its lists' prefix and counting their messages (drop.lua;
-- keys.LISTS_FIELD, keys.WAITING_FIELD): no order key has a space.
local LISTS_FIELD, WAITING_FIELD = ' lists', ' waiting'

-- A new gate's lists' stamp: Redis time in µs.
local function order_stamp()
  local time = redis.call('TIME')
  return time[1] .. string.format('%06d', time[2])
end

-- The list of one key's waiting messages behind `gate`, whose lists carry `stamp`.
local function waiting_list(gate, stamp, key)
  return gate .. ':' .. stamp .. ':' .. key
end

-- A list entry's {id, due ms, record}.
local function split_entry(entry)
  if string.byte(entry, 1) >= 128 then return {record_id(entry), 0, entry} end
  local space = string.find(entry, ' ', 1, true)
  local record = string.sub(entry, space + 1)
  return {record_id(record), tonumber(string.sub(entry, 1, space - 1)), record}
end

-- `entry` (of message `id`) into a waiting list in id order: at its end, unless it holds
-- a later id (a replay or a redrive of an earlier message), then before the first.
local function insert_by_id(list, id, entry)
  local last = redis.call('LINDEX', list, -1)
  if last and split_entry(last)[1] > id then
    for _, e in ipairs(redis.call('LRANGE', list, 0, -1)) do
      if split_entry(e)[1] > id then
        redis.call('LINSERT', list, 'BEFORE', e, entry)
        return
      end
    end
  end
  redis.call('RPUSH', list, entry)
end

-- Of messages published to an ordered channel (`ids`, `records`, `order_keys`: a key
-- or false each), those that go out now: {ids}, {records}. The others wait, with their
-- `due` (ms, 0: now), in publish order, or with `by_id` (messages published before) in
-- id order among those waiting. `stamp`: the channel's order_lists (nil: the waiting
-- ZSET, always in id order).
local function order_admit(o, ids, records, order_keys, due, stamp, by_id)
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
  local prefix = due > 0 and due .. ' ' or ''
  local free_ids, free_records, gate, key_of, waiting, listed = {}, {}, {}, {}, {}, 0
  for i, id in ipairs(ids) do
    local key = order_keys[i]
    if key and out[key] then
      if stamp and by_id then
        insert_by_id(waiting_list(o.gate, stamp, key), id, prefix .. records[i])
        listed = listed + 1
      elseif stamp then
        redis.call('RPUSH', waiting_list(o.gate, stamp, key), prefix .. records[i])
        listed = listed + 1
      else
        waiting[#waiting + 1] = 0
        waiting[#waiting + 1] = key .. ' ' .. id .. ' ' .. due .. ' ' .. records[i]
      end
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
  if listed > 0 then redis.call('HINCRBY', o.meta, 'order_waiting', listed) end
  return free_ids, free_records
end

-- The next waiting message of `key` in the waiting ZSET as {id, due ms, record, member}.
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
-- goes out (a wake-up when the queue was empty, or with o.hold_wake o.woken set: the
-- caller delivers first, and wakes only if some are left), else the key leaves the
-- gate. Returns how many were queued. A channel with no key out pays one EXISTS.
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
  local stamp = redis.call('HGET', o.meta, 'order_lists')
  local now = now_ms()
  local gone, gate, key_of, ready, later, earliest, listed = {}, {}, {}, {}, {}, nil, 0
  local members = {}
  for _, key in ipairs(order_keys) do
    local nxt
    if stamp then
      local entry = redis.call('LPOP', waiting_list(o.gate, stamp, key))
      if entry then
        nxt = split_entry(entry)
        listed = listed + 1
      end
    else
      nxt = next_waiting(o, key)
      if nxt then members[#members + 1] = nxt[4] end
    end
    if nxt then
      local id, due, record = nxt[1], nxt[2], nxt[3]
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
  if #gate == 0 then return 0 end
  if listed > 0 then redis.call('HINCRBY', o.meta, 'order_waiting', -listed) end
  if #members > 0 then call_chunked('ZREM', o.waiting, members) end
  call_chunked('HSET', o.gate, gate)
  call_chunked('HSET', o.key_of, key_of)
  for _, m in ipairs(later) do
    redis.call('HSET', o.msgs, m[1], m[2])
    redis.call('ZADD', o.deferred, m[3], m[1])
  end
  if earliest then due_lower(o.node, o.due_index, o.channel, earliest) end
  if #ready > 0 then
    local length = call_chunked('RPUSH', o.queue, ready)
    if length[#length] == #ready and o.hold_wake then
      o.woken = true
    elseif length[#length] == #ready then
      announce(o.version, o.wake, o.channel, o.node)
    end
  end
  return #ready
end
