-- include: time.lua, history.lua
-- trim: a part's history (lib/history.lua) trimmed as its retention settings say, for
-- topics nobody publishes to (the scanner's sweep) and at once when the settings change
-- (relay-admin retention, /topic/retention). With retention off, the history goes
-- (UNLINK: freed off Redis' main thread), and its state fields with it.
--
-- KEYS[1] topic meta   KEYS[2] topic history (STREAM)
-- ARGV[1] the most entries a trim by size reads
-- Returns {entries trimmed, entries left, bytes retained, the oldest entry's ms or -1}.
local state = history_state(redis.call('HMGET', KEYS[1], unpack(HISTORY_FIELDS)), 1)
if not state then
  local gone = redis.call('XLEN', KEYS[2])
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('UNLINK', KEYS[2])
    redis.call('HDEL', KEYS[1], 'history_added', 'history_start', 'history_first_ms',
               'history_last_ms')
  end
  return {gone, 0, 0, -1}
end
local trimmed = trim_history(KEYS[2], state, now_ms(), tonumber(ARGV[1]))
if trimmed > 0 then
  save_history(KEYS[1], state)
end
return {trimmed, redis.call('XLEN', KEYS[2]), state.added - state.start, state.first or -1}
