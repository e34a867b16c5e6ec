-- include: node.lua
-- news.lua provides announce(), which every script that makes messages ready or
-- changes a channel's or topic's control state calls: it bumps the field `news` of
-- the topic's version key, sets it in the node news hash (node.lua) that each broker
-- reads for all the topics it serves once a second (relay/broker/wakeups.py), and
-- publishes on the topic's wake channel, which tells the brokers at once but may be
-- missed (pub/sub is fire-and-forget). The wake-up is "V|message", V the new `news`: a
-- broker that heard every version since its last read need not look again.
local function announce(version_key, wake, message, node)
  local version = redis.call('HINCRBY', version_key, 'news', 1)
  node_news(node, version_key, version)
  redis.call('PUBLISH', wake, version .. '|' .. message)
end
