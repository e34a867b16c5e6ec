-- include: chunked.lua, record.lua, news.lua
-- replay: one chunk of a part's history (lib/history.lua) put back in a channel's queue,
-- each record as retained: its id, timestamp and body, attempts 0. Forward (a rewind,
-- relay-admin replay): the entries from start to end, oldest first, to the queue's
-- tail. Backward (a channel created from the beginning): from end down to start, each
-- to the queue's head, so the queue ends in publish order, before what was published
-- since. Entries whose count is above the cut (published after the channel was made)
-- are passed over. An id in the channel's msgs hash (in flight or deferred) is skipped:
-- a replay never disturbs it.
--
-- KEYS[1] topic history   KEYS[2] channel queue   KEYS[3] channel msgs
-- KEYS[4] channel meta   KEYS[5] topic channels   KEYS[6] topic version (news.lua)
-- ARGV[1] channel   ARGV[2] start   ARGV[3] end (stream ids as XRANGE takes them)
-- ARGV[4] the most entries read   ARGV[5] 1 forward, 0 backward   ARGV[6] the cut
-- (0: none)   ARGV[7] wake pub/sub channel   ARGV[8] the node keys' prefix (node.lua)
-- Returns {replayed, skipped, entries read, the last entry read or ''}, or nil when the
-- channel does not exist.
if redis.call('SISMEMBER', KEYS[5], ARGV[1]) == 0 then
  return nil
end
local forward, cut = ARGV[5] == '1', tonumber(ARGV[6])
local entries
if forward then
  entries = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[3], 'COUNT', ARGV[4])
else
  entries = redis.call('XREVRANGE', KEYS[1], ARGV[3], ARGV[2], 'COUNT', ARGV[4])
end
local ids, records = {}, {}
for _, entry in ipairs(entries) do
  if cut == 0 or tonumber(string.match(entry[1], '-(%d+)$')) <= cut then
    records[#records + 1] = entry[2][2]
    ids[#ids + 1] = record_id(entry[2][2])
  end
end
local fresh, n = {}, 0
for _, reply in ipairs(call_chunked('HMGET', KEYS[3], ids)) do
  for _, held in ipairs(reply) do
    n = n + 1
    if not held then fresh[#fresh + 1] = records[n] end
  end
end
call_chunked(forward and 'RPUSH' or 'LPUSH', KEYS[2], fresh)
if #fresh > 0 then
  redis.call('HINCRBY', KEYS[4], 'message_count', #fresh)
  announce(KEYS[6], ARGV[7], ARGV[1], ARGV[8])
end
local last = entries[#entries]
return {#fresh, #records - #fresh, #entries, last and last[1] or ''}
