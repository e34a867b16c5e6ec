-- include: chunked.lua
-- inflight.lua provides the in-flight layout. A message in flight is the member
-- "<id> <owner>" of its channel's inflight ZSET (score: its deadline, ms), and its record
-- as it was queued in the msgs hash, as is a deferred one's (its attempts count the
-- deliveries before this one: lib/queue.lua): delivery writes two keys, a FIN deletes
-- from two, and who holds a message is checked by its member alone. Delivery makes no
-- new long string per message: each costs Lua's string table more than a write
-- (BENCHMARKS.md).
-- CODE: the codes scripts answer with (relay/store/codes.py), first in every script.
local ID_LENGTH = 16

local function in_flight_member(id, owner)
  return id .. ' ' .. owner
end

-- The id a member of the inflight ZSET names.
local function member_id(member)
  return string.sub(member, 1, ID_LENGTH)
end

-- Who holds the messages of (owner, id) items args[first], args[first + step], ... up
-- to `last` (owner at i, id at i + 1). Per item n: held[n] the member to take if that
-- owner holds the message, else held[n] false and codes[n] the item's reply:
-- CODE.NOT_IN_FLIGHT, or CODE.NOT_OWNER in flight for another owner. One ZMSCORE per
-- CHUNK items; an item not found looks in the msgs hash (a record there that is not
-- deferred is in flight), which is rare.
-- k: {inflight =, msgs =, deferred =} keys.
local function holdings(k, args, first, last, step)
  local held, codes = {}, {}
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
    return held, codes
  end
  n = 0
  for i = first, last, step do
    n = n + 1
    if not held[n] then
      local id = args[i + 1]
      if redis.call('HEXISTS', k.msgs, id) == 0 or redis.call('ZSCORE', k.deferred, id) then
        codes[n] = CODE.NOT_IN_FLIGHT
      else
        codes[n] = CODE.NOT_OWNER
      end
    end
  end
  return held, codes
end

-- Takes the held messages `ids` (their members `members`) out of the inflight ZSET and,
-- unless `keep`, their records out of the msgs hash: ZREM of the members, HDEL of the ids.
local function release(k, ids, members, keep)
  call_chunked('ZREM', k.inflight, members)
  if not keep then
    call_chunked('HDEL', k.msgs, ids)
  end
end

-- The ids and members in `inflight` whose owner's name starts with `prefix`, as
-- release() takes them.
local function holders(k, prefix)
  local ids, members = {}, {}
  for _, member in ipairs(redis.call('ZRANGE', k.inflight, 0, -1)) do
    if string.sub(member, ID_LENGTH + 2, ID_LENGTH + 1 + #prefix) == prefix then
      ids[#ids + 1] = string.sub(member, 1, ID_LENGTH)
      members[#members + 1] = member
    end
  end
  return ids, members
end
