-- include: fanout.lua, time.lua, chunked.lua, record.lua, queue.lua, news.lua, history.lua, limit.lua, order.lua
-- append.lua provides publishing(), append() and appended(): how published messages are
-- made visible, shared by publish.lua (a whole publish in one call) and publish_step.lua
-- (a step of a staged one). The including script's KEYS[1..8] are publish.lua's, and
-- this file reads the topic's keys among them itself (KEYS[2], KEYS[4..8]): every script
-- that includes it lays them out so.
-- publishing(due) reads, once per call, where its messages go: `channels` (0 while the
-- topic is paused: its backlog keeps them), the channels' depth limits (`limits`, read
-- only when the topic meta counts one, for messages made ready now), which channels are
-- ordered (`ordered`, read only when the topic meta counts one: lib/order.lua) and
-- which of those number what waits (`seqs`: data layout 3), and the history's state
-- (`history`, only with retention on); `due` is the deferred messages' due time (ms),
-- nil for messages ready now.
-- append(p, first, bodies, timestamp, part, order_keys, priorities) queues the bodies
-- (counts first, first + 1, ...) and retains them; `order_keys` (nil: none; else an
-- order key or false per body) pass an ordered channel's gate (lib/order.lua);
-- `priorities` (nil: all 0; else 0-9 per body) go in the ids, and those above 0 into
-- each channel's urgent lists (lib/queue.lua), or with no channel into the backlog with
-- the others, its topic meta's `urgent_backlog` set (subscribe.lua); appended(p, n, bytes, wake, node) does what follows n more:
-- the counters, the overflow of drop-oldest and dead-letter channels, the wake-up and
-- the history's trim.
-- what a trim removes at most, beyond what the call added: entries and record bytes;
-- and by how much the oldest entry may be older than the retention time before a call
-- trims by time: 1% of it, 1 s at most (a trim at every call costs a read of an entry)
local TRIM_ENTRIES, TRIM_BYTES, TRIM_SLACK, TRIM_SLACK_MOST = 1000, 1048576, 0.01, 1000

local function publishing(due)
  local meta = redis.call('HMGET', KEYS[2], 'paused', 'retention_ms', 'retention_bytes',
                          'limited_channels', 'ordered_channels')
  local p = {channels = N_CHANNELS, due = due, added_entries = 0, added_bytes = 0}
  if meta[1] then
    p.channels = 0  -- a paused topic keeps everything in its backlog (pause_topic.lua)
  end
  if meta[4] and meta[4] ~= '0' and p.channels > 0 and not due then
    p.limits = channel_limits(p.channels)
  end
  if meta[5] and meta[5] ~= '0' and p.channels > 0 then
    p.ordered, p.seqs = {}, {}
    for c = 1, p.channels do
      local mode = redis.call('HMGET', channel_key(c, 'meta'), 'ordered', 'order_seqs')
      p.ordered[c], p.seqs[c] = mode[1] ~= false, mode[2] or nil
    end
  end
  if meta[2] or meta[3] then
    p.history = history_state(redis.call('HMGET', KEYS[2], unpack(HISTORY_FIELDS)), 1)
  end
  return p
end

-- {first[1], second[1], first[2], ...}; a non-table `first` repeats.
local function interleave(first, second)
  local out = {}
  for i = 1, #second do
    out[2 * i - 1] = type(first) == 'table' and first[i] or first
    out[2 * i] = second[i]
  end
  return out
end

-- The ids and records that go out in channel c now: all, but on an ordered channel
-- those whose key has a message out wait (lib/order.lua).
local function going_out(p, c, ids, records, order_keys)
  if not (order_keys and p.ordered and p.ordered[c]) then return ids, records end
  local o = order_gate(channel_key(c, 'queue'), channel_key(c, 'deferred'),
                       channel_key(c, 'msgs'), channel_key(c, 'meta'),
                       channel_key(c, 'gate'), channel_key(c, 'key_of'),
                       channel_key(c, 'waiting'), channel_key(c, 'urgent'))
  return order_admit(o, ids, records, order_keys, p.due or 0, p.seqs[c])
end

-- The bodies queued (or deferred) in every channel, else the backlog, and retained;
-- returns their bytes.
local function append(p, first, bodies, timestamp, part, order_keys, priorities)
  local ids = message_ids(part, first, #bodies, priorities)
  local records, counts, bytes = {}, {}, 0
  for i, body in ipairs(bodies) do
    local count = first + i - 1
    records[i] = new_record(timestamp, ids[i], body, count)
    counts[i] = count
    bytes = bytes + #body
  end
  if p.history then
    local size = p.history.size
    p.added_entries = p.added_entries + retain(KEYS[8], p.history, timestamp, records, counts)
    p.added_bytes = p.added_bytes + p.history.size - size
  end
  if not p.due then
    if p.channels == 0 then
      call_chunked('RPUSH', KEYS[4], records)
      if priorities then redis.call('HSET', KEYS[2], 'urgent_backlog', 1) end
    end
    for c = 1, p.channels do
      local _, out = going_out(p, c, ids, records, order_keys)
      if priorities then
        enqueue({queue = channel_key(c, 'queue'), urgent = channel_key(c, 'urgent'),
                 meta = channel_key(c, 'meta')}, out)
      else
        call_chunked('RPUSH', channel_key(c, 'queue'), out)
      end
    end
  else
    if p.channels == 0 then
      call_chunked('ZADD', KEYS[5], interleave(p.due, records))
    end
    for c = 1, p.channels do
      local out_ids, out = going_out(p, c, ids, records, order_keys)
      call_chunked('HSET', channel_key(c, 'msgs'), interleave(out_ids, out))
      call_chunked('ZADD', channel_key(c, 'deferred'), interleave(p.due, out_ids))
    end
  end
  return bytes
end

local function appended(p, n, bytes, wake, node)
  for c = 1, p.channels do
    redis.call('HINCRBY', channel_key(c, 'meta'), 'message_count', n)
    if p.due then
      due_lower(node, KEYS[6], channel_name(c), p.due)
    end
  end
  if p.limits then
    overflow(p.limits, n, KEYS[6], node, now_ms())
  end
  if p.channels > 0 and not p.due then
    announce(KEYS[7], wake, '', node)
  end
  if p.history then
    trim_history(KEYS[8], p.history, now_ms(), TRIM_ENTRIES + p.added_entries,
                 TRIM_BYTES + p.added_bytes,
                 math.min(TRIM_SLACK_MOST, math.floor(p.history.ms * TRIM_SLACK)))
    save_history(KEYS[2], p.history)
  end
  redis.call('HINCRBY', KEYS[2], 'message_count', n)
  redis.call('HINCRBY', KEYS[2], 'message_bytes', bytes)
end
