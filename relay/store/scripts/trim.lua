-- include: time.lua, history.lua
-- trim: a part's history (lib/history.lua) trimmed as its retention settings say, for
-- topics nobody publishes to (the scanner's sweep) and at once when the settings change
-- (relay-admin retention, /topic/retention), a bounded step per call: the caller calls
-- again while it says more is left. With retention off, the history goes (UNLINK:
-- freed off Redis' main thread), and its state fields with it.
--
-- KEYS[1] topic meta   KEYS[2] topic history (STREAM)
-- ARGV[1] the most entries a call removes   ARGV[2] about the most record bytes it
-- removes (and a trim by size reads, to find where to cut)
-- Returns {messages trimmed, messages left, bytes retained, the oldest entry's ms or
-- CODE.NO_TIME, 1 if more may be left to trim else 0}.
local topic_meta, history = KEYS[1], KEYS[2]
local most, most_bytes = tonumber(ARGV[1]), tonumber(ARGV[2])

local state = history_state(redis.call('HMGET', topic_meta, unpack(HISTORY_FIELDS)), 1)
if not state then
  local gone = 0
  if redis.call('EXISTS', history) == 1 then
    local counts = redis.call('HMGET', topic_meta, 'history_messages', 'history_start_messages')
    gone = tonumber(counts[1] or '0') - tonumber(counts[2] or '0')
    redis.call('UNLINK', history)
    redis.call('HDEL', topic_meta, unpack(HISTORY_FIELDS, 3))
  end
  return {gone, 0, 0, CODE.NO_TIME, 0}
end
local trimmed, more = trim_history(history, state, now_ms(), most, most_bytes, 0)
if state.moved then
  save_history(topic_meta, state)
end
return {trimmed, state.messages - state.start_messages, state.size - state.start_size,
        state.first or CODE.NO_TIME, more and 1 or 0}
