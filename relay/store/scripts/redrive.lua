-- include: chunked.lua, news.lua, record.lua, queue.lua, order.lua
-- redrive: put records back at the end of their channel's queue, with their original
-- id and timestamp and attempts reset, and wake the channel's consumers: dead letters
-- (relay-admin redrive), and an ordered channel's replay (workers/operations.py, with
-- `counted`: they count in the channel's message_count, as replay.lua's do).
-- On an ordered channel (lib/order.lua) a record whose id the channel still holds (in
-- flight or deferred: the msgs hash; out for its key: key_of) is skipped, so that no
-- id is there twice (a FIN of one copy would free its key while the other is out), and
-- a record with an order key passes the gate: it waits behind its key's message out,
-- in id order among those waiting.
-- On any other channel the order keys are ignored.
--
-- KEYS[1] topic channels   KEYS[2] channel queue   KEYS[3] topic version (news.lua)
-- KEYS[4] channel meta   KEYS[5] msgs   KEYS[6] gate   KEYS[7] key_of   KEYS[8] waiting
-- KEYS[9] urgent (a record keeps its priority: lib/queue.lua)
-- ARGV[1] channel name   ARGV[2] wake pub/sub channel   ARGV[3] the node keys' prefix
-- (lib/node.lua)   ARGV[4] 1 counted, else 0   ARGV[5] the order keys ('' for none;
-- else one per record joined by newlines, an empty one for a record without)
-- ARGV[6..] records
-- Returns how many were queued (or wait behind their keys), or CODE.REDRIVE_NO_CHANNEL
-- if the channel does not exist.
local channels, queue, version, channel_meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local msgs, gate, key_of, waiting = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local channel, wake, node, counted = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1'
local joined_keys = ARGV[5]
local q = {queue = queue, urgent = KEYS[9], meta = channel_meta}
local FIRST_RECORD = 6

if redis.call('SISMEMBER', channels, channel) == 0 then
  return CODE.REDRIVE_NO_CHANNEL
end
local records = {}
for i = FIRST_RECORD, #ARGV do records[#records + 1] = ARGV[i] end
local mode = redis.call('HMGET', channel_meta, 'ordered', 'order_seqs')
if mode[1] and #records > 0 then
  local ids = {}
  for i, record in ipairs(records) do ids[i] = record_id(record) end
  local held, n = {}, 0
  for _, key in ipairs({msgs, key_of}) do
    n = 0
    for _, reply in ipairs(call_chunked('HMGET', key, ids)) do
      for _, value in ipairs(reply) do
        n = n + 1
        if value then held[n] = true end
      end
    end
  end
  local given = {}
  if joined_keys ~= '' then
    for key in string.gmatch(joined_keys .. '\n', '([^\n]*)\n') do
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
  -- admitting reads the gate's own keys only: no deferred or due index is given
  local o = order_gate(queue, nil, msgs, channel_meta, gate, key_of, waiting, KEYS[9], nil,
                       version, channel, wake, node)
  local _, out = order_admit(o, fresh_ids, fresh, order_keys, 0, mode[2] or nil, true)
  records = fresh
  enqueue(q, out)
else
  enqueue(q, records)
end
if #records > 0 then
  if counted then redis.call('HINCRBY', channel_meta, 'message_count', #records) end
  announce(version, wake, channel, node)
end
return #records
