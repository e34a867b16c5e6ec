-- include: fanout.lua
-- ttl: set or clear a message TTL (ms; deliver.lua reads the channel meta's ttl_ms) on
-- a topic's part or one of its channels. The topic's is kept in its meta (ttl_ms),
-- where subscribe.lua copies it from into a new channel, and copied into each channel
-- that has none of its own; a channel's own (ttl_from "channel") wins over the topic's,
-- and clearing it brings the topic's back (ttl_from "topic", or no TTL). The topic meta's
-- channel_ttl is 1 while a channel has its own.
--
-- KEYS[1] topic meta   KEYS[2] topic channels, then the channels' keys (fanout.lua)
-- ARGV[1..ARG0] the channels (fanout.lua), then: the channel to set ('': the topic),
-- the TTL in ms ('': clear the setting)
-- Returns CODE.DONE, CODE.NO_CHANNEL if the channel named is not one of the topic's, or
-- the stale reply.
fanout_begin()
local topic_meta, channels = KEYS[1], KEYS[2]
local target, ttl = ARGV[ARG0 + 1], ARGV[ARG0 + 2]

local stale = stale_channels(channels)
if stale then return stale end
if target == '' then
  if ttl == '' then
    redis.call('HDEL', topic_meta, 'ttl_ms')
  else
    redis.call('HSET', topic_meta, 'ttl_ms', ttl)
  end
end
local topic_ttl = redis.call('HGET', topic_meta, 'ttl_ms')

-- whether channel c takes the topic's TTL now: each without one of its own when the
-- topic's is set, the one named when its own is cleared
local function inherits(c)
  if target == '' then
    return redis.call('HGET', channel_key(c, 'meta'), 'ttl_from') ~= 'channel'
  end
  return channel_name(c) == target and ttl == ''
end

local found = target == ''
for c = 1, N_CHANNELS do
  local meta = channel_key(c, 'meta')
  found = found or channel_name(c) == target
  if channel_name(c) == target and ttl ~= '' then
    redis.call('HSET', meta, 'ttl_ms', ttl, 'ttl_from', 'channel')
  elseif inherits(c) then
    if topic_ttl then
      redis.call('HSET', meta, 'ttl_ms', topic_ttl, 'ttl_from', 'topic')
    else
      redis.call('HDEL', meta, 'ttl_ms', 'ttl_from')
    end
  end
end

-- the topic meta says when a channel has a TTL of its own (relay/store/expiry.py: the
-- scanner's sweep looks at a part with a TTL in force only)
local own = false
for c = 1, N_CHANNELS do
  own = own or redis.call('HGET', channel_key(c, 'meta'), 'ttl_from') == 'channel'
end
if own then
  redis.call('HSET', topic_meta, 'channel_ttl', 1)
else
  redis.call('HDEL', topic_meta, 'channel_ttl')
end
return found and CODE.DONE or CODE.NO_CHANNEL
