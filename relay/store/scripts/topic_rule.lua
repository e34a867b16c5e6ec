-- include: news.lua
-- topic_rule: set or remove one of a topic's publish rules in part 0's version hash:
-- `order_key`, how a message published without an order key gets one
-- (relay/store/ordering.py), or `priority_rule`, how one gets its priority
-- (relay/store/priorities.py); and make it news, so every broker serving the topic reads
-- it again within a second (versions.lua), as a raised partition count.
--
-- KEYS[1] topic version (part 0's)
-- ARGV[1] the field   ARGV[2] the rule ('' removes it)   ARGV[3] the topic's wake channel
-- ARGV[4] the node keys' prefix (lib/node.lua)
-- Returns CODE.DONE.
local version = KEYS[1]
local field, rule, wake, node = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if rule == '' then
  redis.call('HDEL', version, field)
else
  redis.call('HSET', version, field, rule)
end
announce(version, wake, '', node)
return CODE.DONE
