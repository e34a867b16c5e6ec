-- staged.lua provides marker() and read_marker(): a committed staged publish's entry in
-- its part's publishing hash (keys.py), under its stage's token:
-- "<next count> <last count> <due ms, 0: now> <ms it last advanced> <timestamp, hex>",
-- the count the next step's first message gets, the publish's last, the deferred
-- messages' due time, when a call last made progress (a scanner finishes a publish
-- stalled for long: data_path.py) and the publish's 8-byte timestamp.
local function marker(m)
  local hex = string.gsub(m.timestamp, '.', function(c)
    return string.format('%02x', string.byte(c))
  end)
  return string.format('%d %d %d %d %s', m.next, m.last, m.due or 0, m.advanced, hex)
end

local function read_marker(value)
  local next_count, last, due, advanced, hex =
      string.match(value, '^(%d+) (%d+) (%d+) (%d+) (%x+)$')
  local timestamp = string.gsub(hex, '%x%x', function(byte)
    return string.char(tonumber(byte, 16))
  end)
  due = tonumber(due)
  return {next = tonumber(next_count), last = tonumber(last), due = due > 0 and due or nil,
          advanced = tonumber(advanced), timestamp = timestamp}
end
