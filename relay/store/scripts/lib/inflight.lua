-- include: chunked.lua
-- inflight.lua provides the in-flight layout. A message in flight is the member
-- "<id> <owner>" of its channel's inflight ZSET (score: its deadline, ms), and its record
-- as it was queued in the msgs hash, as is a deferred one's (its attempts count the
-- deliveries before this one: lib/queue.lua): delivery writes two keys, a FIN deletes
-- from two, and who holds a message is checked by its member alone. Delivery makes no
-- new long string per message: each costs Lua's string table more than a write
-- (BENCHMARKS.md).
-- Messages put in flight before this layout are the member "<id>" with the lease
-- "<delivered ms> <owner>" in the leases hash: they are served the same way until none
-- is left (holdings(), release() and holders()).
local ID_LENGTH = 16

local function in_flight_member(id, owner)
  return id .. ' ' .. owner
end

-- The owner of a lease of the layout before.
local function lease_owner(lease)
  return string.sub(lease, string.find(lease, ' ', 1, true) + 1)
end

-- The id a member of the inflight ZSET names, and whether it is of the layout before.
local function member_id(member)
  return string.sub(member, 1, ID_LENGTH), #member == ID_LENGTH
end

-- Who holds the messages of (owner, id) items args[first], args[first + step], ... up
-- to `last` (owner at i, id at i + 1). Per item n: held[n] the member to take if that
-- owner holds the message (old[n] true if in the layout before), else held[n] false and
-- codes[n] the item's reply: 0 not in flight, -1 in flight for another owner. One
-- ZMSCORE per CHUNK items; an item not found looks further (the layout before, then
-- the msgs hash: a record there that is not deferred is in flight), which is rare.
-- k: {inflight =, msgs =, leases =, deferred =} keys.
local function holdings(k, args, first, last, step)
  local held, codes, old = {}, {}, {}
  for i = first, last, step do
    held[#held + 1] = in_flight_member(args[i + 1], args[i])
  end
  local n, missing = 0, 0
  for _, scores in ipairs(call_chunked('ZMSCORE', k.inflight, held)) do
    for _, score in ipairs(scores) do
      n = n + 1
      if not score then
        held[n] = false
        missing = missing + 1
      end
    end
  end
  if missing == 0 then
    return held, codes, old
  end
  n = 0
  for i = first, last, step do
    n = n + 1
    if not held[n] then
      local owner, id = args[i], args[i + 1]
      local lease = redis.call('ZSCORE', k.inflight, id) and redis.call('HGET', k.leases, id)
      if lease then
        if lease_owner(lease) == owner then
          held[n], old[n] = id, true
        else
          codes[n] = -1
        end
      elseif redis.call('HEXISTS', k.msgs, id) == 0 or redis.call('ZSCORE', k.deferred, id) then
        codes[n] = 0
      else
        codes[n] = -1
      end
    end
  end
  return held, codes, old
end

-- Takes the held messages `ids` (their members `members`; old[i] true for one of the
-- layout before) out of the inflight ZSET and, unless `keep`, their records out of the
-- msgs hash: ZREM of the members, HDEL of the ids (and of the leases of the old ones).
local function release(k, ids, members, old, keep)
  call_chunked('ZREM', k.inflight, members)
  if not keep then
    call_chunked('HDEL', k.msgs, ids)
  end
  local leases = {}
  for i, before in pairs(old) do
    if before then leases[#leases + 1] = ids[i] end
  end
  if #leases > 0 then
    call_chunked('HDEL', k.leases, leases)
  end
end

-- The ids and members in `inflight` whose owner's name starts with `prefix`, and which
-- of them are of the layout before (old[i] true), as release() takes them.
local function holders(k, prefix)
  local ids, members, old = {}, {}, {}
  for _, member in ipairs(redis.call('ZRANGE', k.inflight, 0, -1)) do
    if string.sub(member, ID_LENGTH + 2, ID_LENGTH + 1 + #prefix) == prefix then
      ids[#ids + 1] = string.sub(member, 1, ID_LENGTH)
      members[#members + 1] = member
    end
  end
  local leases = redis.call('HGETALL', k.leases)
  for i = 1, #leases, 2 do
    if string.sub(lease_owner(leases[i + 1]), 1, #prefix) == prefix then
      ids[#ids + 1] = leases[i]
      members[#members + 1] = leases[i]
      old[#ids] = true
    end
  end
  return ids, members, old
end
