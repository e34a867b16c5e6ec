-- deliver: pop ready messages of one channel for this broker's clients and put
-- them in flight, in one call for all of them. Each group is one client with its
-- own msg_timeout; attempts are incremented in the record (bytes 9-10).
--
-- KEYS[1] queue   KEYS[2] inflight   KEYS[3] msgs   KEYS[4] leases
-- KEYS[5] scanners' due index   KEYS[6] channel meta (a paused channel delivers nothing)
-- ARGV[1] due member, then groups of 3: owner, timeout ms, count
-- Returns one list of records per group, in ARGV order.
-- Commands with many arguments go in chunks: Lua's unpack() has a stack limit.
local function call_chunked(cmd, key, args)
  for i = 1, #args, 1000 do
    redis.call(cmd, key, unpack(args, i, math.min(i + 999, #args)))
  end
end

local out = {}
if redis.call('HEXISTS', KEYS[6], 'paused') == 1 then
  for g = 2, #ARGV, 3 do out[#out + 1] = {} end
  return out
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local earliest = nil
for g = 2, #ARGV, 3 do
  local deadline = now + tonumber(ARGV[g + 1])
  local lease = string.format('%d %s', now, ARGV[g])
  local records = redis.call('LPOP', KEYS[1], tonumber(ARGV[g + 2])) or {}
  local msgs, inflight, leases = {}, {}, {}
  for i, r in ipairs(records) do
    local attempts = math.min(string.byte(r, 9) * 256 + string.byte(r, 10) + 1, 65535)
    r = string.sub(r, 1, 8) .. string.char(math.floor(attempts / 256), attempts % 256)
        .. string.sub(r, 11)
    local id = string.sub(r, 11, 26)
    records[i] = r
    msgs[2 * i - 1], msgs[2 * i] = id, r
    inflight[2 * i - 1], inflight[2 * i] = deadline, id
    leases[2 * i - 1], leases[2 * i] = id, lease
  end
  if #records > 0 then
    call_chunked('HSET', KEYS[3], msgs)
    call_chunked('ZADD', KEYS[2], inflight)
    call_chunked('HSET', KEYS[4], leases)
    if not earliest or deadline < earliest then earliest = deadline end
  end
  out[#out + 1] = records
end
if earliest then
  redis.call('ZADD', KEYS[5], 'LT', earliest, ARGV[1])
end
return out
