-- touch: push the deadline of in-flight messages back (TOUCH), never past
-- delivery time + max msg timeout (nsqd Channel.TouchMessage).
--
-- KEYS[1] inflight   KEYS[2] leases
-- ARGV[1] max msg timeout ms, then triples: owner, id, msg timeout ms
-- Returns per triple: the new deadline (ms), 0 not in flight, -1 in flight for another client.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max_timeout = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 3 do
  local owner, id = ARGV[i], ARGV[i + 1]
  local lease = redis.call('HGET', KEYS[2], id)
  local space = lease and string.find(lease, ' ', 1, true)
  if not lease then
    out[#out + 1] = 0
  elseif string.sub(lease, space + 1) ~= owner then
    out[#out + 1] = -1
  else
    local delivered = tonumber(string.sub(lease, 1, space - 1))
    local deadline = math.min(now + tonumber(ARGV[i + 2]), delivered + max_timeout)
    redis.call('ZADD', KEYS[1], 'XX', deadline, id)
    out[#out + 1] = deadline
  end
end
return out
