-- include: chunked.lua, record.lua, decimal.lua
-- inflight.lua provides the in-flight layout. A message in flight is the member
-- "<id> <owner>" of its channel's inflight ZSET (score: its deadline, ms), and its record
-- as it was queued in the msgs hash, as is a deferred one's (its attempts count the
-- deliveries before this one: lib/queue.lua): delivery writes two keys, a FIN deletes
-- from two, and who holds a message is checked by its member alone. Delivery makes no
-- new long string per message: each costs Lua's string table more than a write
-- (BENCHMARKS.md).
-- Since data layout 4, what one deliver call hands one client (2 to LOT_MAX messages;
-- of an ordered channel too since relay 0.6.1) goes in flight as a lot: one member "<lot> <owner>", one field
-- <lot> of the msgs hash (the records' lengths, a newline, the records) and one field
-- <lot>+ of a '0' per message, '1' once finished. The lot's name (lot_named) is a number
-- of its topic part's, counted in the version hash's field `lots`: no id, and no
-- "<key> <seq>" field of lib/order.lua; since relay 0.6.1 (before: its first id with the
-- last hex digit moved to g-v, which a lot of that message delivered again reused).
-- The broker names such a message by its item: id, lot, index in two characters from
-- '0' (LOT_ITEM long); a FIN of several of a lot's, by one lot run of them (LOT_RUN_ITEM
-- a message: lib/finish.lua). Only a FIN keeps the lot (finish.lua); a REQ, a TOUCH, a timeout
-- or a leaving owner first turns it back into one member and one record per message it
-- still holds (explode). The channel meta's `lotted` counts what lots hold beyond one
-- message each, so in flight = ZCARD + lotted.
-- CODE: the codes scripts answer with (relay/store/codes.py), first in every script.
local ID_LENGTH = 16
local LOT_MAX, LOT_ITEM = 4096, 34
local LOT_RUN_ITEM = 2 + ID_LENGTH   -- a message of a lot run (lib/finish.lua): index, id
local DONE, NOT_DONE = 49, 48   -- '1', '0'

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

-- The name of lot number `n` of its topic part: 'x', n in 14 hex digits, 'g'. Numbers
-- are never used again, so an item a client was given for a lot since turned back into
-- messages names no lot it holds later (a name taken from the lot's first id named the
-- next lot that message went out first in alike: a FIN of the old item marked the new
-- lot's message at that index).
local function lot_named(n)
  return string.format('x%014xg', n)
end

-- Whether an in-flight member (or its first ID_LENGTH characters) names a lot.
local function is_lot(member)
  return string.byte(member, ID_LENGTH) > 102
end

local function member_owner(member)
  return string.sub(member, ID_LENGTH + 2)
end

-- The msgs fields of a lot of `records` (2 to LOT_MAX), appended to `fields`.
local function lot_fields(fields, lot, records)
  local lengths = {}
  for i, r in ipairs(records) do lengths[i] = decimal(#r) end
  local n = #fields
  fields[n + 1], fields[n + 2] = lot, table.concat(lengths, ' ') .. '\n' .. table.concat(records)
  fields[n + 3], fields[n + 4] = lot .. '+', string.rep('0', #records)
end

-- The lot `lot` of `owner`, if it holds one, back as one member and one record per
-- message not finished, at the lot's deadline. Returns their ids and members.
local function explode(k, lot, owner)
  local member = lot .. ' ' .. owner
  local deadline = redis.call('ZSCORE', k.inflight, member)
  local ids, members = {}, {}
  if not deadline then
    return ids, members
  end
  local got = redis.call('HMGET', k.msgs, lot, lot .. '+')
  local blob, done = got[1], got[2]
  local head = string.find(blob, '\n', 1, true)
  local at, i, fields, scored = head + 1, 0, {}, {}
  for length in string.gmatch(string.sub(blob, 1, head - 1), '%d+') do
    i = i + 1
    length = tonumber(length)
    if string.byte(done, i) == NOT_DONE then
      local r = string.sub(blob, at, at + length - 1)
      local id = record_id(r)
      ids[#ids + 1] = id
      members[#ids] = id .. ' ' .. owner
      fields[#fields + 1], fields[#fields + 2] = id, r
      scored[#scored + 1], scored[#scored + 2] = deadline, members[#ids]
    end
    at = at + length
  end
  redis.call('ZREM', k.inflight, member)
  redis.call('HDEL', k.msgs, lot, lot .. '+')
  if #ids > 0 then
    call_chunked('HSET', k.msgs, fields)
    call_chunked('ZADD', k.inflight, scored)
    redis.call('HINCRBY', k.meta, 'lotted', 1 - #ids)
  end
  return ids, members
end

-- Items (owner, x, ...) of args[first..last] by `step`: where x is a lot item, its lot
-- is turned back into members first (explode) and x becomes the id alone.
local function unlot(k, args, first, last, step)
  local seen = {}
  for i = first, last, step do
    local x = args[i + 1]
    if #x == LOT_ITEM then
      local lot = string.sub(x, ID_LENGTH + 1, 2 * ID_LENGTH)
      if not seen[lot] then
        seen[lot] = true
        explode(k, lot, args[i])
      end
      args[i + 1] = string.sub(x, 1, ID_LENGTH)
    end
  end
end

-- The ids and members of `members` as release() takes them, a lot's turned back into
-- its messages first (explode); with `most`, no member after the first once that many
-- ids are in (a lot may hold thousands: the scanner's calls stay short).
local function held_ids(k, members, most)
  local ids, out = {}, {}
  for _, member in ipairs(members) do
    if most and #ids >= most then
      break
    elseif is_lot(member) then
      local lot_ids, lot_members = explode(k, string.sub(member, 1, ID_LENGTH),
                                           member_owner(member))
      for i, id in ipairs(lot_ids) do
        ids[#ids + 1], out[#ids + 1] = id, lot_members[i]
      end
    else
      ids[#ids + 1], out[#ids + 1] = string.sub(member, 1, ID_LENGTH), member
    end
  end
  return ids, out
end

-- The ids and members in `inflight` whose owner's name starts with `prefix`, as
-- release() takes them.
local function holders(k, prefix)
  local members = {}
  for _, member in ipairs(redis.call('ZRANGE', k.inflight, 0, -1)) do
    if string.sub(member, ID_LENGTH + 2, ID_LENGTH + 1 + #prefix) == prefix then
      members[#members + 1] = member
    end
  end
  return held_ids(k, members)
end
