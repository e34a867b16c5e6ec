-- include: fanout.lua, time.lua, chunked.lua, record.lua, news.lua, history.lua, dedup.lua, limit.lua
-- publish: append messages to every channel of a topic, now or deferred.
-- With no channel yet, they wait in the topic backlog for the first one
-- (nsqd keeps them in the topic queue the same way). With the topic's retention on
-- (its meta's settings, lib/history.lua), the history keeps a copy of each, in this
-- same call (an entry per call, or per ENTRY_BYTES of it), and is trimmed by a bounded
-- step.
--
-- KEYS[1] topic ids (STRING)   KEYS[2] topic meta   KEYS[3] topic channels
-- KEYS[4] backlog (LIST)       KEYS[5] backlog deferred (ZSET record -> due)
-- KEYS[6] topic due index (scanners)   KEYS[7] topic version (news.lua)
-- KEYS[8] topic history (STREAM)
-- KEYS[9] the staged bodies (LIST), or with publish keys the dedup set (ZSET,
-- lib/dedup.lua), only when ARGV says so; then the channels' keys (fanout.lua)
-- ARGV[1..ARG0] the channels (fanout.lua), then: wake pub/sub channel,
-- 8-byte timestamp, defer ms (0 = now), the part's number (keys.py), the number of
-- bodies staged in KEYS[9] (0: the bodies follow in ARGV), the node keys' prefix
-- (lib/node.lua), the number of publish keys (0: none; never with a stage), bodies...,
-- then with keys one more: a key per body, joined by spaces (one argument costs less
-- to send than one per key; keys have no spaces). With keys, it returns {the count of
-- the last message or 0 if none was published, the number of duplicates}: a key the
-- part's dedup window remembers is not published again (lib/dedup.lua).
-- A call's arguments are bounded (runner.MAX_CALL_ARGS), so a bigger MPUB stages its
-- bodies first, in commands sent just before this call; this call publishes all of
-- them or none, and deletes the stage. Its first write is INCRBY: at maxmemory Redis
-- refuses it before anything is written (lib/maxmemory.lua).
-- With a channel's depth limit (lib/limit.lua; only read when the topic meta counts
-- one) a publish to the queues is refused before that write when a `reject` channel
-- has no room for all of it (its stage deleted), and each `drop-oldest` or
-- `dead-letter` channel's oldest go after it.
-- Ids are the part's number in 4 hex digits, then the topic's count in 12.
-- Returns the count of the last message (ids are consecutive), or the stale reply.
local stale = stale_channels(KEYS[3])
if stale then return stale end
local wake, timestamp = ARGV[ARG0 + 1], ARGV[ARG0 + 2]
local defer = tonumber(ARGV[ARG0 + 3])
local part = tonumber(ARGV[ARG0 + 4])
local staged = tonumber(ARGV[ARG0 + 5])
local NODE = ARGV[ARG0 + 6]
local keyed = tonumber(ARGV[ARG0 + 7])
local FIRST_BODY = ARG0 + 8
local n = staged
if staged == 0 then n = #ARGV - FIRST_BODY + 1 - math.min(keyed, 1) end
local fresh, duplicates, window = nil, 0, nil   -- positions to publish, with keys
local publish_keys = nil
if keyed > 0 then
  publish_keys = dedup_split(ARGV[#ARGV])
  fresh, duplicates, window = dedup_fresh(KEYS[2], KEYS[9], publish_keys)
  n = #fresh
  if n == 0 then return {0, duplicates} end
end
-- a stage Redis refused part of (at maxmemory, lib/maxmemory.lua): publish none of it
if staged > 0 and redis.call('LLEN', KEYS[9]) ~= staged then
  return redis.error_reply('the MPUB was not staged whole: redis refused part of it')
end
local channels = N_CHANNELS
local meta = redis.call('HMGET', KEYS[2], 'paused', 'retention_ms', 'retention_bytes',
                        'limited_channels')
if meta[1] then
  channels = 0  -- a paused topic keeps everything in its backlog (pause_topic.lua)
end
local limits = nil    -- read only when a channel has a depth limit (lib/limit.lua)
if meta[4] and meta[4] ~= '0' and channels > 0 and defer == 0 then
  limits = channel_limits(channels)
  local full = full_channel(limits, n, part_of(KEYS[2]))
  if full then
    if staged > 0 then redis.call('DEL', KEYS[9]) end
    return redis.error_reply(full)
  end
end
local last = redis.call('INCRBY', KEYS[1], n)
local first = last - n + 1
if window then dedup_remember(KEYS[9], window, publish_keys, fresh) end
local BATCH = 10000   -- messages handled at a time, so a big MPUB's records never all
                      -- sit in the script's memory at once

-- the bodies from..to (1-based, of this call's messages)
local function bodies(from, to)
  if staged > 0 then
    return redis.call('LRANGE', KEYS[9], from - 1, to - 1)
  end
  local out = {}
  for i = from, to do out[#out + 1] = ARGV[FIRST_BODY + (fresh and fresh[i] or i) - 1] end
  return out
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

local history = nil   -- read only with retention on: off, a publish reads no more
if meta[2] or meta[3] then
  history = history_state(redis.call('HMGET', KEYS[2], unpack(HISTORY_FIELDS)), 1)
end
-- what a trim removes at most, beyond what this call added: entries and record bytes;
-- and by how much the oldest entry may be older than the retention time before a call
-- trims by time: 1% of it, 1 s at most (a trim at every call costs a read of an entry)
local TRIM_ENTRIES, TRIM_BYTES, TRIM_SLACK, TRIM_SLACK_MOST = 1000, 1048576, 0.01, 1000
local added_entries, added_bytes = 0, 0
local due = nil
if defer > 0 then due = now_ms() + defer end
local bytes = 0
for from = 1, n, BATCH do
  local batch = bodies(from, math.min(from + BATCH - 1, n))
  local ids, records, counts = {}, {}, {}
  for i, body in ipairs(batch) do
    local count = first + from + i - 2
    ids[i] = string.format('%04x%012x', part, count)
    records[i] = new_record(timestamp, ids[i], body, count)
    counts[i] = count
    bytes = bytes + #body
  end
  if history then
    local size = history.size
    added_entries = added_entries + retain(KEYS[8], history, timestamp, records, counts)
    added_bytes = added_bytes + history.size - size
  end
  if not due then
    if channels == 0 then
      call_chunked('RPUSH', KEYS[4], records)
    end
    for c = 1, channels do
      call_chunked('RPUSH', channel_key(c, 'queue'), records)
    end
  else
    if channels == 0 then
      call_chunked('ZADD', KEYS[5], interleave(due, records))
    end
    for c = 1, channels do
      call_chunked('HSET', channel_key(c, 'msgs'), interleave(ids, records))
      call_chunked('ZADD', channel_key(c, 'deferred'), interleave(due, ids))
    end
  end
end
for c = 1, channels do
  redis.call('HINCRBY', channel_key(c, 'meta'), 'message_count', n)
  if due then
    due_lower(NODE, KEYS[6], channel_name(c), due)
  end
end
if limits then
  overflow(limits, n, KEYS[6], NODE, now_ms())
end
if channels > 0 and not due then
  announce(KEYS[7], wake, '', NODE)
end
if staged > 0 then
  redis.call('DEL', KEYS[9])
end
if history then
  trim_history(KEYS[8], history, now_ms(), TRIM_ENTRIES + added_entries,
               TRIM_BYTES + added_bytes,
               math.min(TRIM_SLACK_MOST, math.floor(history.ms * TRIM_SLACK)))
  save_history(KEYS[2], history)
end
redis.call('HINCRBY', KEYS[2], 'message_count', n)
redis.call('HINCRBY', KEYS[2], 'message_bytes', bytes)
if keyed > 0 then return {last, duplicates} end
return last
