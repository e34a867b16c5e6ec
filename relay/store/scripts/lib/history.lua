-- include: record.lua
-- history.lua provides a part's history (keys.py: relay:{T}:history), the copy of every
-- message published while the topic's retention is on, in publish order:
-- history_state() reads it from the topic meta's fields, retain() adds a call's
-- records, trim_history() trims it by time and size, save_history() writes the state.
-- An entry's id is "<ms>-<count>": ms its message's timestamp in ms, made non-decreasing
-- (never below the last entry's), count the one its message id ends with (which only
-- grows), so XRANGE by time is native and the id is recoverable. Its fields: r, the
-- record as queued (attempts 0), and o, the bytes ever retained through it: the bytes
-- retained are history_added - history_start, where history_start is the o of the
-- oldest entry less its record's size, so a trim by time (XTRIM MINID, which reads no
-- entry) reads only the oldest entry left to keep the count exact.
-- Meta fields: retention_ms, retention_bytes (settings; 0 or absent: no limit of that
-- kind; both absent: retention off), history_added, history_start, history_first_ms
-- (the oldest entry's ms; absent when empty), history_last_ms (the newest entry's ms).
local HISTORY_FIELDS = {'retention_ms', 'retention_bytes', 'history_added', 'history_start',
                        'history_first_ms', 'history_last_ms'}

-- The state from the values of an HMGET of HISTORY_FIELDS at `at` on; nil if off.
local function history_state(values, at)
  local ms, bytes = tonumber(values[at] or '0'), tonumber(values[at + 1] or '0')
  if ms <= 0 and bytes <= 0 then return nil end
  return {ms = ms, bytes = bytes, added = tonumber(values[at + 2] or '0'),
          start = tonumber(values[at + 3] or '0'), first = tonumber(values[at + 4] or ''),
          last = tonumber(values[at + 5] or '0')}
end

-- Add `records` (their counts in `counts`) of a message timestamp to the history.
local function retain(key, state, timestamp, records, counts)
  local ms = math.max(timestamp_ms(timestamp), state.last)
  for i, record in ipairs(records) do
    state.added = state.added + #record
    redis.call('XADD', key, string.format('%d-%d', ms, counts[i]), 'r', record,
               'o', state.added)
  end
  state.last = ms
  if not state.first then state.first = ms end
end

-- The oldest entry read again after a trim: where the bytes retained start, its ms.
local function reread_first(key, state)
  local first = redis.call('XRANGE', key, '-', '+', 'COUNT', 1)[1]
  if first then
    state.start = tonumber(first[2][4]) - #first[2][2]
    state.first = tonumber(string.match(first[1], '^(%d+)'))
  else
    state.start, state.first = state.added, nil
  end
end

-- Trim entries older than state.ms before `now` (ms), then the oldest past state.bytes,
-- reading at most `budget` entries for the latter. Returns the entries trimmed.
local function trim_history(key, state, now, budget)
  local trimmed = 0
  if state.ms > 0 and state.first and state.first < now - state.ms then
    trimmed = redis.call('XTRIM', key, 'MINID', now - state.ms)
    reread_first(key, state)
  end
  if state.bytes > 0 and state.added - state.start > state.bytes then
    local keep_from = state.added - state.bytes   -- the oldest whose o is this or more
    local last = nil                               -- goes last, with all before it
    for _, entry in ipairs(redis.call('XRANGE', key, '-', '+', 'COUNT', budget)) do
      last = entry[1]
      if tonumber(entry[2][4]) >= keep_from then break end
    end
    if last then
      local ms, seq = string.match(last, '^(%d+)-(%d+)$')
      trimmed = trimmed + redis.call('XTRIM', key, 'MINID', ms .. '-' .. (tonumber(seq) + 1))
      reread_first(key, state)
    end
  end
  return trimmed
end

-- The state's fields written back to the meta hash.
local function save_history(meta, state)
  redis.call('HSET', meta, 'history_added', state.added, 'history_start', state.start,
             'history_last_ms', state.last)
  if state.first then
    redis.call('HSET', meta, 'history_first_ms', state.first)
  else
    redis.call('HDEL', meta, 'history_first_ms')
  end
end
