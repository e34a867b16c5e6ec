-- include: chunked.lua, time.lua, news.lua, record.lua, queue.lua
-- order.lua provides the gate of ordered channels (relay-admin order; relay/store/
-- ordering.py): order_gate() to name a channel's, order_admit() for messages published
-- to one, order_release() for messages that leave one. On an ordered channel each order
-- key has at most one message out (queued, in flight or deferred): the gate hash maps
-- the key to its id, key_of the id to its key. A REQ or a timeout keeps a message out,
-- so it stays first for its key; every other exit (FIN, dead letter, TTL, delete)
-- releases the key: its next message goes out (queued, or deferred until its due
-- time), else the key leaves the gate, so a key with nothing out costs nothing.
-- The messages behind a key wait in one of two shapes, by the channel meta's field
-- `order_seqs` (relay/store/layout.py):
-- * set (data layout 3): in the msgs hash, each under "<order key> <seq>" (an id has no
--   space), the key's numbered in publish order from its gate value's: a key with
--   messages waiting has "<id out> <first seq> <next seq>" there. An entry is the
--   record as it will be queued, or for one due later "<due ms> <record>" (a record
--   starts with a byte of 128 or more, a digit does not). A release reads and deletes
--   the first entry of each key released with one HMGET and one HDEL for them all; the
--   meta's `order_waiting` counts the entries.
-- * absent (data layout 2): one ZSET `waiting`, all at score 0, of "<order key> <id>
--   <due ms, 0: now> <record>": a key's in id order, which is its publish order (a key
--   always goes to the same part); a release is one ZRANGEBYLEX per key.
-- Either way every key is one the caller declares. The queue only holds messages free
-- to go: deliver.lua pops it as any channel's.
-- o: the channel's gate, as order_gate() builds it.

-- The gate of one channel (o): its keys queue, deferred, msgs, meta, gate, key_of,
-- waiting and urgent (lib/queue.lua: o is also a channel's ready messages there), and
-- for what goes out when a key is released its topic's due index and version keys, the
-- channel's name, its wake pub/sub channel and the node keys' prefix (lib/node.lua).
-- order_admit() needs the channel's keys alone.
local function order_gate(queue, deferred, msgs, meta, gate, key_of, waiting, urgent,
                          due_index, version, channel, wake, node)
  return {queue = queue, deferred = deferred, msgs = msgs, meta = meta, gate = gate,
          key_of = key_of, waiting = waiting, urgent = urgent, due_index = due_index,
          version = version, channel = channel, wake = wake, node = node}
end

-- The field of a trashed msgs hash counting the messages numbered in it (drop.lua;
-- keys.WAITING_FIELD): no id or "<order key> <seq>" starts with a space.
local WAITING_FIELD = ' waiting'

-- A gate value's id out, and if messages wait its first and next seq (as written): an
-- id is 16 characters.
local function split_gate(value)
  if #value == 16 then return value end
  local space = string.find(value, ' ', 19, true)
  return string.sub(value, 1, 16), string.sub(value, 18, space - 1), string.sub(value, space + 1)
end

-- The gate value of key with `id` out and the entries [first, next) behind it.
local function gate_value(id, first, next)
  if first and first < tonumber(next) then return id .. ' ' .. first .. ' ' .. next end
  return id
end

-- The seq after `seq` (as written), most often with no number formatted: a release
-- makes one per message, and Lua 5.1 formats a number by sprintf.
local DIGIT_AFTER = {[48] = '1', [49] = '2', [50] = '3', [51] = '4', [52] = '5', [53] = '6',
                     [54] = '7', [55] = '8', [56] = '9'}
local function seq_after(seq)
  local digit = DIGIT_AFTER[string.byte(seq, -1)]
  if digit then return string.sub(seq, 1, -2) .. digit end
  return tostring(tonumber(seq) + 1)
end

-- An entry's id, due ms and record.
local function split_entry(entry)
  if string.byte(entry, 1) >= 128 then return record_id(entry), 0, entry end
  local space = string.find(entry, ' ', 1, true)
  local record = string.sub(entry, space + 1)
  return record_id(record), tonumber(string.sub(entry, 1, space - 1)), record
end

-- The values of `fields` of hash `key` (false for one absent), in HMGETs of CHUNK.
local function hmget_chunked(key, fields)
  local replies = call_chunked('HMGET', key, fields)
  if #replies == 1 then return replies[1] end
  local out = {}
  for _, reply in ipairs(replies) do
    for _, value in ipairs(reply) do out[#out + 1] = value end
  end
  return out
end

-- Each key of `by_key` (key -> {{id, entry}...} of messages published before, in any
-- order) with its waiting entries rewritten in id order, the new ones among them:
-- a replay or a redrive (o: the gate; gate: key -> {id out, first, next}).
local function insert_by_id(o, gate, by_key)
  local values = {}
  for key, added in pairs(by_key) do
    local g = gate[key]
    local first, next = tonumber(g[2] or 1), tonumber(g[3] or 1)
    local fields, all = {}, {}
    for seq = first, next - 1 do fields[#fields + 1] = key .. ' ' .. seq end
    if #fields > 0 then
      for _, entry in ipairs(hmget_chunked(o.msgs, fields)) do
        if entry then all[#all + 1] = {(split_entry(entry)), entry} end
      end
      call_chunked('HDEL', o.msgs, fields)
    end
    for _, a in ipairs(added) do all[#all + 1] = a end
    table.sort(all, function(x, y) return x[1] < y[1] end)
    local writes = {}
    for i, e in ipairs(all) do
      writes[#writes + 1], writes[#writes + 2] = key .. ' ' .. (first + i - 1), e[2]
    end
    call_chunked('HSET', o.msgs, writes)
    values[#values + 1], values[#values + 2] = key, gate_value(g[1], first, first + #all)
  end
  if #values > 0 then call_chunked('HSET', o.gate, values) end
end

-- Of messages published to an ordered channel (`ids`, `records`, `order_keys`: a key
-- or false each), those that go out now: {ids}, {records}. The others wait, with their
-- `due` (ms, 0: now), in publish order, or with `by_id` (messages published before) in
-- id order among those waiting. `seqs`: the channel's order_seqs (nil: the waiting
-- ZSET, always in id order).
local function order_admit(o, ids, records, order_keys, due, seqs, by_id)
  local wanted = {}
  for i = 1, #ids do
    if order_keys[i] then wanted[#wanted + 1] = order_keys[i] end
  end
  if #wanted == 0 then return ids, records end
  local gate = {}     -- key -> {id out, first seq, next seq} while it has a message out
  for n, value in ipairs(hmget_chunked(o.gate, wanted)) do
    if value then gate[wanted[n]] = {split_gate(value)} end
  end
  local prefix = due > 0 and due .. ' ' or ''
  local free_ids, free_records, out, key_of, waiting, entries = {}, {}, {}, {}, {}, {}
  local grown, by_key, listed = {}, {}, 0
  for i, id in ipairs(ids) do
    local key = order_keys[i]
    local g = key and gate[key]
    if g and seqs and by_id then
      by_key[key] = by_key[key] or {}
      table.insert(by_key[key], {id, prefix .. records[i]})
      listed = listed + 1
    elseif g and seqs then
      local next = g[3] or '1'
      g[2], g[3] = g[2] or '1', seq_after(next)
      entries[#entries + 1] = key .. ' ' .. next
      entries[#entries + 1] = due > 0 and prefix .. records[i] or records[i]
      if not grown[key] then grown[key], grown[#grown + 1] = true, key end
      listed = listed + 1
    elseif g then
      waiting[#waiting + 1] = 0
      waiting[#waiting + 1] = key .. ' ' .. id .. ' ' .. due .. ' ' .. records[i]
    else
      if key then
        gate[key] = {id}
        out[#out + 1], out[#out + 2] = key, id
        key_of[#key_of + 1], key_of[#key_of + 2] = id, key
      end
      free_ids[#free_ids + 1], free_records[#free_records + 1] = id, records[i]
    end
  end
  for _, key in ipairs(grown) do     -- each with entries [first, next) now
    local g = gate[key]
    out[#out + 1], out[#out + 2] = key, g[1] .. ' ' .. g[2] .. ' ' .. g[3]
  end
  if #out > 0 then call_chunked('HSET', o.gate, out) end
  if #key_of > 0 then call_chunked('HSET', o.key_of, key_of) end
  if #entries > 0 then call_chunked('HSET', o.msgs, entries) end
  if #waiting > 0 then call_chunked('ZADD', o.waiting, waiting) end
  if next(by_key) then insert_by_id(o, gate, by_key) end
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
-- Per key the work is a field of each of a few variadic commands; a key numbered with a
-- gap (a waiting message deleted: remove.lua) costs an HGET per entry missing.
local function order_release(o, ids)
  if #ids == 0 or redis.call('EXISTS', o.key_of) == 0 then return 0 end
  local left, order_keys, n = {}, {}, 0
  for i, key in ipairs(hmget_chunked(o.key_of, ids)) do
    if key then n = n + 1; left[n], order_keys[n] = ids[i], key end
  end
  if n == 0 then return 0 end
  call_chunked('HDEL', o.key_of, left)
  local now, sorted = now_ms(), nil
  local gone, gate, key_of, ready, later, earliest, listed = {}, {}, {}, {}, {}, nil, 0
  local members = {}
  -- the keys numbered, with entries: their first seq (as written) and next seq
  local wkeys, wfirst, wnext, fields, w = {}, {}, {}, {}, 0
  local g, r = 0, 0     -- the lengths of gate (and key_of), ready
  for i, value in ipairs(hmget_chunked(o.gate, order_keys)) do
    local key = order_keys[i]
    if value and #value > 16 then
      local space = string.find(value, ' ', 19, true)
      local first = string.sub(value, 18, space - 1)
      w = w + 1
      wkeys[w], wfirst[w], wnext[w], fields[w] = key, first, string.sub(value, space + 1),
                                                 key .. ' ' .. first
    else
      if sorted == nil then sorted = redis.call('EXISTS', o.waiting) == 1 end
      local nxt = sorted and next_waiting(o, key)
      if nxt then
        members[#members + 1] = nxt[4]
        gate[g + 1], gate[g + 2] = key, nxt[1]
        key_of[g + 1], key_of[g + 2] = nxt[1], key
        g = g + 2
        if nxt[2] > now then
          later[#later + 1] = {nxt[1], nxt[3], nxt[2]}
        else
          r = r + 1
          ready[r] = nxt[3]
        end
      else
        gone[#gone + 1] = key
      end
    end
  end
  if w > 0 then
    local entries = hmget_chunked(o.msgs, fields)
    for m = 1, w do
      -- the key's entry, and the seq after it: its new first, or its next if none is left
      local entry, key, last, after = entries[m], wkeys[m], wnext[m], seq_after(wfirst[m])
      if not entry then     -- a gap: the entries after, one by one
        local first, stop = tonumber(after), tonumber(last)
        while not entry and first < stop do
          fields[#fields + 1] = key .. ' ' .. first
          entry = redis.call('HGET', o.msgs, fields[#fields])
          first = first + 1
        end
        after = tostring(first)
      end
      if entry then
        local id, due, record = split_entry(entry)
        listed = listed + 1
        gate[g + 1], gate[g + 2] = key, after ~= last and id .. ' ' .. after .. ' ' .. last or id
        key_of[g + 1], key_of[g + 2] = id, key
        g = g + 2
        if due > now then
          later[#later + 1] = {id, record, due}
        else
          r = r + 1
          ready[r] = record
        end
      else
        gone[#gone + 1] = key
      end
    end
    call_chunked('HDEL', o.msgs, fields)
  end
  if #gone > 0 then call_chunked('HDEL', o.gate, gone) end
  if g == 0 then return 0 end
  if listed > 0 then redis.call('HINCRBY', o.meta, 'order_waiting', -listed) end
  if #members > 0 then call_chunked('ZREM', o.waiting, members) end
  call_chunked('HSET', o.gate, gate)
  call_chunked('HSET', o.key_of, key_of)
  for _, m in ipairs(later) do
    redis.call('HSET', o.msgs, m[1], m[2])
    redis.call('ZADD', o.deferred, m[3], m[1])
    if not earliest or m[3] < earliest then earliest = m[3] end
  end
  if earliest then due_lower(o.node, o.due_index, o.channel, earliest) end
  if enqueue(o, ready) then
    if o.hold_wake then
      o.woken = true
    else
      announce(o.version, o.wake, o.channel, o.node)
    end
  end
  return #ready
end
