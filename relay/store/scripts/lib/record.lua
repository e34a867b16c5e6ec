-- record.lua provides the stored record's layout (relay/codec.py) as positions in a
-- Lua string (from 1): [8-byte ns timestamp, top bit set][2-byte big-endian attempts]
-- [body][16-byte hex id][the id's last byte value], and record_id(), record_attempts(),
-- with_attempts(), message_id(), record_priority(), new_record() and timestamp_ms(). The id goes last
-- because Lua hashes a long string from bytes sampled from its end (relay/codec.py).
-- tests/test_store.py checks them against relay/codec.py.
local RECORD_ATTEMPTS = 9   -- the attempts' first byte
local NO_ATTEMPTS = '\0\0'     -- a literal: a library's loading reaches no string.*

local function record_id(record)
  return string.sub(record, -17, -2)
end

local function record_attempts(record)
  return string.byte(record, RECORD_ATTEMPTS) * 256 + string.byte(record, RECORD_ATTEMPTS + 1)
end

-- the record with `attempts` (0-65535) in place of its own
local function with_attempts(record, attempts)
  return string.sub(record, 1, RECORD_ATTEMPTS - 1)
      .. string.char(math.floor(attempts / 256), attempts % 256)
      .. string.sub(record, RECORD_ATTEMPTS + 2)
end

-- A message's id: its priority (0-9: data layout 5) in one hex digit, its part's number
-- in 3, then the topic's count in 12.
local function message_id(part, count, priority)
  return string.format('%x%03x%012x', priority or 0, part, count)
end

-- The ids of counts first, first + 1, ... (priorities: nil, else each one's), as
-- message_id makes them with one string made per id: Lua 5.1 formats a number by
-- sprintf (0.3-0.5 µs of a published message), so an id is the text of its count but
-- the last hex digit, made once per 16 counts and priority, and that digit.
local HEX_DIGIT = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c', 'd',
                   'e', 'f'}
local function message_ids(part, first, n, priorities)
  local ids, heads = {}, {}
  for i = 1, n do
    local count, priority = first + i - 1, priorities and priorities[i] or 0
    local low = count % 16
    if low == 0 then heads = {} end
    local head = heads[priority]
    if not head then
      head = string.format('%x%03x%011x', priority, part, (count - low) / 16)
      heads[priority] = head
    end
    ids[i] = head .. HEX_DIGIT[low + 1]
  end
  return ids
end

-- A stored record's priority (0-9), its id's first digit.
local function record_priority(record)
  return string.byte(record, -17) - 48
end

-- a record never delivered; `timestamp` is the 8-byte timestamp the Store packed
-- (codec.stored_timestamp), `count` the topic's count the id ends with
local function new_record(timestamp, id, body, count)
  return timestamp .. NO_ATTEMPTS .. body .. id .. string.char(count % 256)
end

-- A stored record's timestamp (its first 8 bytes, big-endian ns, top bit set) in ms,
-- exactly (a record or the timestamp alone):
-- hi * 2^32 + lo ns, with hi * 2^32 / 10^6 = hi * 4294 + hi * 967296 / 10^6.
local function timestamp_ms(timestamp)
  local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(timestamp, 1, 8)
  local hi = ((b1 % 128) * 256 + b2) * 65536 + b3 * 256 + b4
  local rest = hi * 967296 + ((b5 * 256 + b6) * 65536 + b7 * 256 + b8)
  return math.floor(hi * 4294 + (rest - rest % 1000000) / 1000000)
end
