-- record.lua provides the stored record's layout (relay/codec.py) as positions in a
-- Lua string (from 1): [8-byte ns timestamp, top bit set][2-byte big-endian attempts]
-- [body][16-byte hex id][the id's last byte value], and record_id(), record_attempts(),
-- with_attempts() and new_record(). The id goes last because Lua hashes a long string
-- from bytes sampled from its end (relay/codec.py). A record whose first byte has no
-- top bit is of the layout before: [timestamp][attempts][id][body].
-- tests/test_store.py checks them against relay/codec.py.
local RECORD_ATTEMPTS = 9   -- the attempts' first byte
local NO_ATTEMPTS = string.char(0, 0)

local function record_id(record)
  if string.byte(record, 1) >= 128 then
    return string.sub(record, -17, -2)
  end
  return string.sub(record, 11, 26)
end

local function record_attempts(record)
  return string.byte(record, RECORD_ATTEMPTS) * 256 + string.byte(record, RECORD_ATTEMPTS + 1)
end

-- the record with `attempts` (0-65535) in place of its own (either layout)
local function with_attempts(record, attempts)
  return string.sub(record, 1, RECORD_ATTEMPTS - 1)
      .. string.char(math.floor(attempts / 256), attempts % 256)
      .. string.sub(record, RECORD_ATTEMPTS + 2)
end

-- a record never delivered; `timestamp` is the 8-byte timestamp the Store packed
-- (codec.stored_timestamp), `count` the topic's count the id ends with
local function new_record(timestamp, id, body, count)
  return timestamp .. NO_ATTEMPTS .. body .. id .. string.char(count % 256)
end
