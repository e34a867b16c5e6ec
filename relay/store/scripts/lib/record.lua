-- record.lua provides the stored record's layout (relay/codec.py) as positions in a
-- Lua string (from 1): [8-byte ns timestamp][2-byte big-endian attempts]
-- [16-byte hex id][body], and record_id(), record_attempts(), with_attempts() and
-- new_record(). tests/test_store.py checks them against relay/codec.py.
local RECORD_ATTEMPTS = 9   -- the attempts' first byte
local RECORD_ID = 11        -- the id's first byte
local RECORD_ID_END = 26    -- the id's last byte; the body follows
local NO_ATTEMPTS = string.char(0, 0)

local function record_id(record)
  return string.sub(record, RECORD_ID, RECORD_ID_END)
end

local function record_attempts(record)
  return string.byte(record, RECORD_ATTEMPTS) * 256 + string.byte(record, RECORD_ATTEMPTS + 1)
end

-- the record with `attempts` (0-65535) in place of its own
local function with_attempts(record, attempts)
  return string.sub(record, 1, RECORD_ATTEMPTS - 1)
      .. string.char(math.floor(attempts / 256), attempts % 256)
      .. string.sub(record, RECORD_ID)
end

-- a record never delivered; `timestamp` is the 8-byte timestamp the Store packed
local function new_record(timestamp, id, body)
  return timestamp .. NO_ATTEMPTS .. id .. body
end
