-- include: news.lua
-- order_key: set or remove a topic's rule for the order key of a message published
-- without one (relay/store/ordering.py), in part 0's version hash, and make it news, so
-- every broker serving the topic reads it again within a second (versions.lua), as a
-- raised partition count.
--
-- KEYS[1] topic version (part 0's)
-- ARGV[1] the rule ('' removes it)   ARGV[2] the topic's wake channel   ARGV[3] the node
-- keys' prefix (lib/node.lua)
-- Returns CODE.DONE.
local version = KEYS[1]
local rule, wake, node = ARGV[1], ARGV[2], ARGV[3]

if rule == '' then
  redis.call('HDEL', version, 'order_key')
else
  redis.call('HSET', version, 'order_key', rule)
end
announce(version, wake, '', node)
return CODE.DONE
