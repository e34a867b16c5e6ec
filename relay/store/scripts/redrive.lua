-- include: chunked.lua, news.lua, record.lua, order.lua
-- redrive: put records back at the end of their channel's queue, with their original
-- id and timestamp and attempts reset, and wake the channel's consumers: dead letters
-- (relay-admin redrive), and an ordered channel's replay (workers/operations.py, with
-- `counted`: they count in the channel's message_count, as replay.lua's do).
-- On an ordered channel (lib/order.lua) a record whose id the channel still holds (in
-- flight or deferred: the msgs hash; out for its key: key_of) is skipped, so that no
-- id is there twice (a FIN of one copy would free its key while the other is out), and
-- a record with an order key passes the gate: it waits behind its key's message out.
-- On any other channel the order keys are ignored.
--
-- KEYS[1] topic channels   KEYS[2] channel queue   KEYS[3] topic version (news.lua)
-- KEYS[4] channel meta   KEYS[5] msgs   KEYS[6] gate   KEYS[7] key_of   KEYS[8] waiting
-- ARGV[1] channel name   ARGV[2] wake pub/sub channel   ARGV[3] the node keys' prefix
-- (lib/node.lua)   ARGV[4] 1 counted, else 0   ARGV[5] the order keys ('' for none;
-- else one per record joined by newlines, an empty one for a record without)
-- ARGV[6..] records
-- Returns how many were queued (or wait behind their keys), or -1 if the channel does
-- not exist.
local FIRST = 6
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
  return -1
end
local records = {}
for i = FIRST, #ARGV do records[#records + 1] = ARGV[i] end
if redis.call('HEXISTS', KEYS[4], 'ordered') == 1 and #records > 0 then
  local ids = {}
  for i, record in ipairs(records) do ids[i] = record_id(record) end
  local held, n = {}, 0
  for _, key in ipairs({KEYS[5], KEYS[7]}) do
    n = 0
    for _, reply in ipairs(call_chunked('HMGET', key, ids)) do
      for _, value in ipairs(reply) do
        n = n + 1
        if value then held[n] = true end
      end
    end
  end
  local given = {}
  if ARGV[5] ~= '' then
    for key in string.gmatch(ARGV[5] .. '\n', '([^\n]*)\n') do
      given[#given + 1] = key ~= '' and key
    end
  end
  local fresh_ids, fresh, order_keys, seen = {}, {}, {}, {}
  for i, record in ipairs(records) do
    if not held[i] and not seen[ids[i]] then
      seen[ids[i]] = true
      fresh_ids[#fresh_ids + 1], fresh[#fresh + 1] = ids[i], record
      order_keys[#fresh] = given[i] or false
    end
  end
  local _, out = order_admit({gate = KEYS[6], key_of = KEYS[7], waiting = KEYS[8]},
                             fresh_ids, fresh, order_keys, 0)
  records = fresh
  if #out > 0 then call_chunked('RPUSH', KEYS[2], out) end
else
  call_chunked('RPUSH', KEYS[2], records)
end
if #records > 0 then
  if ARGV[4] == '1' then redis.call('HINCRBY', KEYS[4], 'message_count', #records) end
  announce(KEYS[3], ARGV[2], ARGV[1], ARGV[3])
end
return #records
