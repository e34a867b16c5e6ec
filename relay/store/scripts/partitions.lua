-- include: news.lua
-- partitions: a topic's partition count (keys.py), set for a new topic from the
-- caller's default, and raised on request; never lowered. The parts' placement (the
-- salts their names carry: keys.part_names) is written with the count: the parts there
-- keep theirs, new ones take the caller's, so every process names them alike.
--
-- KEYS[1] topic version (part 0's; fields `partitions`, absent: 1, `placement`, and
-- `order_key`: the topic's rule for the order key of a message that has none,
-- relay/store/ordering.py, which brokers learn with the count, and `priority_rule`, its
-- rule for a message's priority, relay/store/priorities.py)
-- KEYS[2] topic meta   KEYS[3] topic channels (part 0's: every part has the same)
-- ARGV[1] the default for a topic that is new (neither key exists)
-- ARGV[2] the count to raise it to (0: only read)   ARGV[3] the topic's wake channel
-- ARGV[4] the node keys' prefix (lib/node.lua): raising the count is news to brokers
-- ARGV[5] the retention (ms) of a topic that is new (0: none, nsqd's), written to part
-- 0's meta (lib/history.lua); the caller writes the other parts'
-- ARGV[6] the salts of parts 1, 2, ... for the count it may set ('': none,
-- relay/store/placement.py)
-- Returns {the count now, the count before, 1 if this call found the topic new and
-- gave it the retention, else 0, the placement now ('' if none), the order key rule
-- ('' if none), the number of channels (a publish to many goes wide: lib/wide.lua), the
-- priority rule ('' if none)}.
local version, topic_meta = KEYS[1], KEYS[2]
local default, wanted, wake, node = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local retention, given = tonumber(ARGV[5] or '0'), ARGV[6] or ''

local fields = redis.call('HMGET', version, 'partitions', 'placement', 'order_key',
                         'priority_rule')
local rule, priority_rule = fields[3] or '', fields[4] or ''
local before = tonumber(fields[1] or '0')
local placement = fields[2] or ''
local made = 0
if before == 0 then
  if ((wanted == 0 and default > 1) or retention > 0) and redis.call('EXISTS', version) == 0
      and redis.call('EXISTS', topic_meta) == 0 then
    if wanted == 0 and default > 1 then wanted = default end
    if retention > 0 then
      redis.call('HSET', topic_meta, 'retention_ms', retention)
      made = 1
    end
  end
  before = 1
end
if wanted <= before then
  return {before, before, made, placement, rule, redis.call('SCARD', KEYS[3]), priority_rule}
end
redis.call('HSET', version, 'partitions', wanted)
if given ~= '' or placement ~= '' then
  local salts, offered = {}, {}
  for salt in placement:gmatch('%S+') do salts[#salts + 1] = salt end
  for salt in given:gmatch('%S+') do offered[#offered + 1] = salt end
  for i = #salts + 1, wanted - 1 do
    salts[i] = (i >= before and offered[i]) or '0'
  end
  placement = table.concat(salts, ' ')
  redis.call('HSET', version, 'placement', placement)
end
announce(version, wake, '', node)
return {wanted, before, made, placement, rule, redis.call('SCARD', KEYS[3]), priority_rule}
