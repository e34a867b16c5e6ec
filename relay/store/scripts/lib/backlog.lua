-- include: record.lua, node.lua
-- backlog.lua provides hand_over_deferred(): the deferred part of
-- a topic's backlog goes to a channel, to its first one (subscribe.lua) or to every
-- one when the topic is unpaused (pause_topic.lua). Each message keeps its due time,
-- and the channel's entry in the topic's due index (and the node's, node.lua) is
-- lowered to match.
-- `deferred` is {record, due ms, ...}, as ZRANGE WITHSCORES gives the backlog.
-- UNPAUSING: the topic meta's `paused` while its backlog goes to its channels in steps
-- (pause_topic.lua): still paused to publishes, which go behind it.
local UNPAUSING = 'unpausing'
local function hand_over_deferred(deferred, msgs, channel_deferred, due_index, channel, node)
  for i = 1, #deferred, 2 do
    local record, due = deferred[i], deferred[i + 1]
    local id = record_id(record)
    redis.call('HSET', msgs, id, record)
    redis.call('ZADD', channel_deferred, due, id)
    due_lower(node, due_index, channel, due)
  end
end
