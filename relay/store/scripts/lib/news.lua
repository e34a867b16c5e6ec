-- include: node.lua
-- news.lua provides announce(), which every script that makes messages ready or
-- changes a channel's or topic's control state calls: it bumps the part's field in its
-- node's news hash (node.lua), which each broker reads for all the topics it serves
-- once a second (relay/broker/wakeups.py), and publishes on the topic's wake channel,
-- which tells the brokers at once but may be missed (pub/sub is fire-and-forget). The
-- wake-up is "V|message", V the new news: a broker that heard every version since its
-- last read need not look again. Where the node's keys cannot be written (no node
-- given, or a stale slot map's: node.lua), the news is counted in the field `news` of
-- the part's version key instead, which a broker reads where the node hash has no
-- field for the part (versions.lua); a part's first news in the node hash goes on from
-- that count, so its version never goes back.
local function announce(version_key, wake, message, node)
  local version = node and redis.pcall('HINCRBY', node .. 'news', part_of(version_key), 1)
  if type(version) ~= 'number' then
    version = redis.call('HINCRBY', version_key, 'news', 1)
  elseif version == 1 then
    local before = tonumber(redis.call('HGET', version_key, 'news') or '0')
    if before > 0 then
      version = redis.call('HINCRBY', node .. 'news', part_of(version_key), before)
    end
  end
  redis.call('PUBLISH', wake, version .. '|' .. message)
end
