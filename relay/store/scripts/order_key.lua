-- include: news.lua
-- order_key: set or remove a topic's rule for the order key of a message published
-- without one (relay/store/ordering.py), in part 0's version hash, and make it news, so
-- every broker serving the topic reads it again within a second (versions.lua), as a
-- raised partition count.
--
-- KEYS[1] topic version (part 0's)
-- ARGV[1] the rule ('' removes it)   ARGV[2] the topic's wake channel   ARGV[3] the node
-- keys' prefix (lib/node.lua)
if ARGV[1] == '' then
  redis.call('HDEL', KEYS[1], 'order_key')
else
  redis.call('HSET', KEYS[1], 'order_key', ARGV[1])
end
announce(KEYS[1], ARGV[2], '', ARGV[3])
return 1
