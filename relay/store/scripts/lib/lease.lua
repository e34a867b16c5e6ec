-- lease.lua provides new_lease() and held(): an in-flight message's lease in its
-- channel's leases hash is "<delivered ms> <owner>" (written by deliver.lua, checked
-- by FIN, REQ and TOUCH; the Store's admin requeue and relay/stats.py read it too).
local function new_lease(delivered_ms, owner)
  return string.format('%d %s', delivered_ms, owner)
end

-- The delivery time (ms) of message `id` if `owner` holds its lease in hash `leases`;
-- else nil and the reply for that item: 0 not in flight, -1 in flight for another client.
local function held(leases, id, owner)
  local lease = redis.call('HGET', leases, id)
  if not lease then
    return nil, 0
  end
  local space = string.find(lease, ' ', 1, true)
  if string.sub(lease, space + 1) ~= owner then
    return nil, -1
  end
  return tonumber(string.sub(lease, 1, space - 1))
end
