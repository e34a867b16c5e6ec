-- include: record.lua, decimal.lua
-- history.lua provides a part's history (keys.py: relay:{T}:history), the copy of every
-- message published while the topic's retention is on, in publish order:
-- history_state() reads it from the topic meta's fields, retain() adds a call's
-- records, trim_history() trims it by time and size, save_history() writes the state,
-- entry_messages() and entry_span() read an entry.
-- An entry holds the records of one publish call (a call of more than ENTRY_BYTES of
-- records takes several entries, each of consecutive messages): one XADD per call, not
-- per message. Its id is "<ms>-<count>": ms the call's timestamp in ms (a call's
-- messages share it), made non-decreasing (never below the last entry's), count the
-- one its first message's id ends with (which only grows), so XRANGE by time is native
-- and ids are recoverable: the entry's messages have counts count, count + 1, ...
-- Its fields, in this order: l, the lengths of its records in decimal, separated by
-- spaces (one per message); e, m and o, the entries, messages and record bytes the
-- history ever had before it (with those, a trim knows what it removes from the first
-- entry it keeps, without reading the others); r, the records as queued (attempts 0),
-- one after the other (last: the small fields go into the listpack before it, while it
-- is small).
-- Meta fields: retention_ms, retention_bytes (settings; 0 or absent: no limit of that
-- kind; both absent: retention off); history_entries, history_messages, history_bytes
-- (the entries, messages and bytes ever retained: the next entry's e, m and o);
-- history_start_entries, history_start_messages, history_start_bytes (the oldest
-- entry's e, m and o; the former three when empty), so what is retained is the
-- difference; history_first_ms (the oldest entry's ms; absent when empty),
-- history_last_ms (the newest entry's ms).
local HISTORY_FIELDS = {'retention_ms', 'retention_bytes', 'history_entries',
                        'history_messages', 'history_bytes', 'history_start_entries',
                        'history_start_messages', 'history_start_bytes', 'history_first_ms',
                        'history_last_ms'}
-- the most record bytes an entry takes (it takes one record at least), or an eighth of
-- retention_bytes if that is less: a trim by size goes by whole entries (below)
local ENTRY_BYTES = 65536
-- where an entry's values are in its fields as XRANGE gives them
local ENTRY_L, ENTRY_E, ENTRY_M, ENTRY_O, ENTRY_R = 2, 4, 6, 8, 10

-- The state from the values of an HMGET of HISTORY_FIELDS at `at` on; nil if off.
local function history_state(values, at)
  local function number(i) return tonumber(values[at + i] or '0') end
  local ms, bytes = number(0), number(1)
  if ms <= 0 and bytes <= 0 then return nil end
  return {ms = ms, bytes = bytes, entries = number(2), messages = number(3), size = number(4),
          start_entries = number(5), start_messages = number(6), start_size = number(7),
          first = tonumber(values[at + 8] or ''), last = number(9), moved = false}
end

-- Add `records` (their counts in `counts`, consecutive) of a message timestamp to the
-- history, in as few entries as the cap allows. Returns the entries added.
local function retain(key, state, timestamp, records, counts)
  if #records == 0 then return 0 end
  local ms = math.max(timestamp_ms(timestamp), state.last)
  local cap = ENTRY_BYTES
  if state.bytes > 0 then cap = math.min(cap, math.floor(state.bytes / 8)) end
  local lengths, size, from, added = {}, 0, 1, 0
  local function add(to)
    redis.call('XADD', key, string.format('%d-%d', ms, counts[from]),
               'l', table.concat(lengths, ' ', from, to), 'e', state.entries,
               'm', state.messages, 'o', state.size, 'r', table.concat(records, '', from, to))
    state.entries, state.messages, state.size =
        state.entries + 1, state.messages + to - from + 1, state.size + size
    added = added + 1
  end
  for i, record in ipairs(records) do
    local length = #record
    lengths[i] = decimal(length)
    if i > from and size + length > cap then
      add(i - 1)
      from, size = i, 0
    end
    size = size + length
  end
  add(#records)
  state.last = ms
  if not state.first then state.first = ms end
  return added
end

-- (ms, first count) of an entry id
local function entry_id(id)
  local ms, count = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(count)
end

-- The messages of an entry (as XRANGE gives it) and their records' bytes.
local function entry_span(entry)
  local _, spaces = string.gsub(entry[2][ENTRY_L], ' ', ' ')
  return spaces + 1, #entry[2][ENTRY_R]
end

-- An entry's records whose counts are from `low` to `high` (inclusive), in publish
-- order, and the count of its last message.
local function entry_messages(entry, low, high)
  local _, count = entry_id(entry[1])
  local records, blob, at = {}, entry[2][ENTRY_R], 1
  for length in string.gmatch(entry[2][ENTRY_L], '%d+') do
    local size = tonumber(length)
    if count >= low and count <= high then
      records[#records + 1] = string.sub(blob, at, at + size - 1)
    end
    at, count = at + size, count + 1
  end
  return records, count - 1
end

-- The entries before `keep` (an entry as XRANGE gives it; nil: all) removed, but
-- `most` at most, and about `most_bytes` of records at most (as many entries as that
-- is at their mean size, one at least): then the oldest that many (XTRIM MAXLEN, exact,
-- reading none). The state's start moves to the oldest left. Returns the messages
-- removed.
local function cut(key, state, keep, most, most_bytes)
  local before, bytes = state.entries, state.size
  if keep then before, bytes = tonumber(keep[2][ENTRY_E]), tonumber(keep[2][ENTRY_O]) end
  before, bytes = before - state.start_entries, bytes - state.start_size
  if before <= 0 then   -- nothing before it: only a first ms out of date to correct
    state.first, state.moved = keep and (entry_id(keep[1])), true
    return 0
  end
  if bytes > most_bytes then
    most = math.min(most, math.max(1, math.floor(before * most_bytes / bytes)))
  end
  if before > most then
    redis.call('XTRIM', key, 'MAXLEN', math.max(0, redis.call('XLEN', key) - most))
    keep = redis.call('XRANGE', key, '-', '+', 'COUNT', 1)[1]
  elseif keep then
    redis.call('XTRIM', key, 'MINID', keep[1])
  else
    redis.call('XTRIM', key, 'MAXLEN', 0)
  end
  local messages = state.start_messages
  if keep then
    state.start_entries, state.start_messages, state.start_size =
        tonumber(keep[2][ENTRY_E]), tonumber(keep[2][ENTRY_M]), tonumber(keep[2][ENTRY_O])
    state.first = (entry_id(keep[1]))
  else
    state.start_entries, state.start_messages, state.start_size =
        state.entries, state.messages, state.size
    state.first = nil
  end
  state.moved = true
  return state.start_messages - messages
end

-- Whether the oldest entry is older than the retention time before `now`, or what is
-- retained is over the retention bytes.
local function over(state, now)
  return state.first ~= nil and ((state.ms > 0 and state.first < now - state.ms) or
      (state.bytes > 0 and state.size - state.start_size > state.bytes))
end

-- Trim the entries older than state.ms before `now` (ms), once the oldest is older than
-- that by more than `slack` ms (a publish's: so it trims once in a while rather than at
-- each call): one read, of the first entry to keep. Then the oldest while what is
-- retained is over state.bytes, by whole entries: one goes when any of its bytes is over
-- the limit, so what stays is within it; those are read from the oldest, to find the
-- first to keep. Each removes (and the latter reads) at most `most` entries and about
-- `most_bytes` of records. Returns the messages trimmed and whether more is left to trim
-- (a budget ran out).
local function trim_history(key, state, now, most, most_bytes, slack)
  local trimmed = 0
  if state.first and state.ms > 0 and state.first < now - state.ms - slack then
    local cutoff = string.format('%d', now - state.ms)
    trimmed = cut(key, state, redis.call('XRANGE', key, cutoff, '+', 'COUNT', 1)[1], most,
                  most_bytes)
  end
  if state.first and state.bytes > 0 and state.size - state.start_size > state.bytes then
    local keep_from = state.size - state.bytes    -- an entry starting before it goes
    local keep, from, read, bytes, want = nil, '-', 0, 0, 2
    while not keep and read < most and bytes < most_bytes do
      local entries = redis.call('XRANGE', key, from, '+', 'COUNT', want)
      for _, entry in ipairs(entries) do
        if tonumber(entry[2][ENTRY_O]) >= keep_from then
          keep = entry
          break
        end
        read, bytes = read + 1, bytes + #entry[2][ENTRY_R]
        if read >= most or bytes >= most_bytes then break end
      end
      if #entries < want then break end
      from, want = '(' .. entries[#entries][1], math.min(want * 2, 64)
    end
    trimmed = trimmed + cut(key, state, keep, read, math.huge)
  end
  return trimmed, over(state, now)
end

-- The state's fields written back to the meta hash.
local function save_history(meta, state)
  local fields = {'history_entries', state.entries, 'history_messages', state.messages,
                  'history_bytes', state.size, 'history_last_ms', state.last}
  if state.moved then
    fields[9], fields[10] = 'history_start_entries', state.start_entries
    fields[11], fields[12] = 'history_start_messages', state.start_messages
    fields[13], fields[14] = 'history_start_bytes', state.start_size
  end
  if state.first then
    local n = #fields
    fields[n + 1], fields[n + 2] = 'history_first_ms', state.first
  else
    redis.call('HDEL', meta, 'history_first_ms')
  end
  redis.call('HSET', meta, unpack(fields))
end
