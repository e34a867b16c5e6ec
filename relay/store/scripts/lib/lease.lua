-- lease.lua provides new_lease(), parse_lease(), lease_of(), held() and leases_of(): an
-- in-flight message's lease in
-- its channel's leases hash is "<delivered ms> <owner>" (written by deliver.lua, checked
-- by FIN, REQ and TOUCH; the Store's admin requeue and relay/store/stats.py read it too).
local function new_lease(delivered_ms, owner)
  return string.format('%d %s', delivered_ms, owner)
end

-- The delivery time (ms) and the owner a lease names.
local function parse_lease(lease)
  local space = string.find(lease, ' ', 1, true)
  return tonumber(string.sub(lease, 1, space - 1)), string.sub(lease, space + 1)
end

-- The delivery time (ms) in `lease` (a leases hash value, or false) if `owner` holds it;
-- else nil and the reply for that item: 0 not in flight, -1 in flight for another client.
local function lease_of(lease, owner)
  if not lease then
    return nil, 0
  end
  local delivered, holder = parse_lease(lease)
  if holder ~= owner then
    return nil, -1
  end
  return delivered
end

-- lease_of() for message `id` of hash `leases`.
local function held(leases, id, owner)
  return lease_of(redis.call('HGET', leases, id), owner)
end

-- The leases of ids args[first], args[first + step], ... up to args[last], of hash
-- `leases`, in that order, read with one HMGET per 1000 ids (unpack() has a stack limit).
local function leases_of(leases, args, first, last, step)
  local out = {}
  local ids = {}
  for i = first, last, step do
    ids[#ids + 1] = args[i]
    if #ids == 1000 or i + step > last then
      for _, lease in ipairs(redis.call('HMGET', leases, unpack(ids))) do
        out[#out + 1] = lease
      end
      ids = {}
    end
  end
  return out
end
