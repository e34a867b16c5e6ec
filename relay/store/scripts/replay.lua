-- include: chunked.lua, record.lua, queue.lua, news.lua, history.lua, inflight.lua
-- replay: one chunk of a part's history (lib/history.lua) put back in a channel's queue,
-- each record as retained: its id, timestamp and body, attempts 0. Forward (a rewind,
-- relay-admin replay): the messages from start to end, oldest first, to the queue's
-- tail. Backward (a channel created from the beginning): from end down to start, each
-- to the queue's head, so the queue ends in publish order, before what was published
-- since. Messages whose count is above the cut (published after the channel was made)
-- are passed over. An id in the channel's msgs hash (in flight or deferred) is skipped:
-- a replay never disturbs it (lots in flight, lib/inflight.lua, are turned back into
-- messages first, so each of theirs is there). Handing back (an ordered channel's replay,
-- workers/operations.py): the records that are not skipped are returned instead of
-- queued, and the caller queues them through the channel's gate (redrive.lua).
-- The range is of messages: start "<ms>-<count>" is the message of that count at that
-- ms, inside an entry whose id is before it (an MPUB's entry, which starts at its first
-- message) as well as at an entry's id; "(<id>" starts after that entry, "-" at the
-- oldest; end is an id or ms as XRANGE takes it. A call takes whole entries (but a
-- start inside one) until it has read `budget` messages at least.
--
-- KEYS[1] topic history   KEYS[2] channel queue   KEYS[3] channel msgs
-- KEYS[4] channel meta   KEYS[5] topic channels   KEYS[6] topic version (news.lua)
-- KEYS[7] channel inflight   KEYS[8] channel urgent (a message keeps its priority: lib/queue.lua)
-- ARGV[1] channel   ARGV[2] start   ARGV[3] end (stream ids as XRANGE takes them)
-- ARGV[4] the messages to read (at least one entry's)   ARGV[5] 1 forward, 0 backward
-- ARGV[6] the cut (0: none)   ARGV[7] wake pub/sub channel   ARGV[8] the node keys'
-- prefix (node.lua)   ARGV[9] 1 to hand the records back (absent: 0)
-- Returns {replayed, skipped, messages read, the last entry read or '', 1 if the range
-- is done else 0}, handing back with the records not skipped as a 6th (replayed 0), or
-- nil when the channel does not exist.
local history, queue, msgs, channel_meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local channels, version, inflight = KEYS[5], KEYS[6], KEYS[7]
local channel, start, stop, budget = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local forward, cut = ARGV[5] == '1', tonumber(ARGV[6])
local wake, node, hand_back = ARGV[7], ARGV[8], ARGV[9] == '1'

if redis.call('SISMEMBER', channels, channel) == 0 then
  return nil
end
if cut == 0 then cut = math.huge end
local records, read, entries, last = {}, 0, 0, ''

-- the entry before `start` holding messages from it on (an entry begun before it), and
-- the count of start's message; nil if none
local function head()
  local ms, count = entry_id(start)
  if not ms or count == 0 then return nil end
  local before = redis.call('XREVRANGE', history, start, '-', 'COUNT', 1)[1]
  if not before then return nil end
  local before_ms, first = entry_id(before[1])
  local stop_ms = tonumber(string.match(stop, '^%(?(%d+)'))
  if before_ms ~= ms or first == count or first + entry_span(before) - 1 < count
      or (stop ~= '+' and not (stop_ms and stop_ms >= ms)) then
    return nil
  end
  return before, count
end

-- an entry's messages from count `low` on (up to the cut), in the order of the pushes
local function take(entry, low)
  local taken, upto = entry_messages(entry, low, cut)
  local _, first = entry_id(entry[1])
  read = read + upto - math.max(low, first) + 1
  entries = entries + 1
  last = entry[1]
  local n = #records
  for i = 1, #taken do
    records[n + i] = forward and taken[i] or taken[#taken - i + 1]
  end
end

local from, done = forward and start or stop, false
if forward then
  local entry, low = head()
  if entry then take(entry, low) end
end
while not done and read < budget do
  local want = 4    -- entries; then as many as the messages left need, at the rate so far
  if entries > 0 then want = math.ceil((budget - read) * entries / read) end
  want = math.max(1, math.min(want, 64))
  local range
  if forward then
    range = redis.call('XRANGE', history, from, stop, 'COUNT', want)
  else
    range = redis.call('XREVRANGE', history, from, start, 'COUNT', want)
  end
  local used = 0
  for i, entry in ipairs(range) do
    take(entry, 0)
    used = i
    if read >= budget then break end
  end
  done = used == #range and #range < want
  if used > 0 then from = '(' .. range[used][1] end
end
if done and not forward then
  local entry, low = head()
  if entry then take(entry, low) end
end

local lots = {}
for _, member in ipairs(redis.call('ZRANGE', inflight, 0, -1)) do
  if is_lot(member) then lots[#lots + 1] = member end
end
held_ids({inflight = inflight, msgs = msgs, meta = channel_meta}, lots)
local ids = {}
for i, record in ipairs(records) do
  ids[i] = record_id(record)
end
local fresh, n = {}, 0
for _, reply in ipairs(call_chunked('HMGET', msgs, ids)) do
  for _, held in ipairs(reply) do
    n = n + 1
    if not held then fresh[#fresh + 1] = records[n] end
  end
end
if hand_back then
  return {0, #records - #fresh, read, last, done and 1 or 0, fresh}
end
enqueue({queue = queue, urgent = KEYS[8], meta = channel_meta}, fresh, not forward)
if #fresh > 0 then
  redis.call('HINCRBY', channel_meta, 'message_count', #fresh)
  announce(version, wake, channel, node)
end
return {#fresh, #records - #fresh, read, last, done and 1 or 0}
