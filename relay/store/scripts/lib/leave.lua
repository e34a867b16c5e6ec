-- include: chunked.lua, record.lua, queue.lua
-- leave.lua provides drop_if_unused(): after a broker's consumers left a channel (it
-- unsubscribed one, or a reaper removed a dead broker's), an ephemeral channel with no
-- consumer left on any broker is deleted, and an ephemeral topic with its last channel.
-- l: the topic's keys {channels =, topic_meta =, due_index =} and the channel's
-- {consumers =, channel_meta =, urgent =, others =}, others the list of its keys but
-- consumers (keys.CHANNEL_SUFFIXES order, its meta and urgent among them), which go
-- with it, as do its urgent lists (lib/queue.lua).
-- Returns CODE.KEPT, CODE.CHANNEL_DELETED, or CODE.TOPIC_DELETED (the channel and topic).
local function drop_if_unused(l, channel, channel_ephemeral, topic_ephemeral)
  if channel_ephemeral ~= '1' or redis.call('HLEN', l.consumers) > 0 then
    return CODE.KEPT
  end
  redis.call('SREM', l.channels, channel)
  redis.call('ZREM', l.due_index, channel)
  if redis.call('HEXISTS', l.channel_meta, 'ordered') == 1 then
    redis.call('HINCRBY', l.topic_meta, 'ordered_channels', -1)   -- lib/order.lua
  end
  for _, level in ipairs(urgent_levels(l.urgent)) do
    redis.call('UNLINK', urgent_list(l.urgent, level[1]))
  end
  redis.call('UNLINK', l.consumers, unpack(l.others))
  if topic_ephemeral == '1' and redis.call('SCARD', l.channels) == 0 then
    redis.call('UNLINK', l.topic_meta)
    return CODE.TOPIC_DELETED
  end
  return CODE.CHANNEL_DELETED
end
