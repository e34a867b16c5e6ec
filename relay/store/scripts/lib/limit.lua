-- include: fanout.lua, chunked.lua, deadletter.lua, node.lua
-- limit.lua provides channel_limits(), full_channel() and overflow(): the depth limits
-- of a topic's channels (relay-admin limit), which publish.lua reads only when its topic
-- meta counts a limited channel (`limited_channels`), so an unlimited topic pays nothing.
-- A channel's meta holds `max_depth` (the limit as set), `part_max_depth` (this part's
-- share of it: the limit holds per part) and `overflow` (reject, drop-oldest or
-- dead-letter). The depth is the queue's length: what waits to be delivered, as nsqd's
-- depth (in flight and deferred messages are not counted).
local MOVE_STEP = 1000   -- records dead-lettered per LRANGE

-- {channel number, part's limit, overflow, limit as set, depth} of each limited channel
local function channel_limits(channels)
  local limits = {}
  for c = 1, channels do
    local got = redis.call('HMGET', channel_key(c, 'meta'), 'part_max_depth', 'overflow',
                           'max_depth')
    if got[1] then
      limits[#limits + 1] = {c = c, depth = tonumber(got[1]), overflow = got[2],
                             shown = got[3], queued = redis.call('LLEN', channel_key(c, 'queue'))}
    end
  end
  return limits
end

-- The refusal of `n` more messages by the first `reject` channel they would take past
-- its limit, else nil. `topic` names it (a part's hash tag is "T" or "T/i").
local function full_channel(limits, n, topic)
  for _, l in ipairs(limits) do
    if l.overflow == 'reject' and l.queued + n > l.depth then
      return 'channel ' .. string.match(topic, '^[^/]+') .. '/' .. channel_name(l.c)
          .. ' is full (max depth ' .. l.shown .. ')'
    end
  end
  return nil
end

-- The oldest records of a dead-letter channel's queue, `count` of them, to its outbox.
local function dead_letter_oldest(c, count)
  local queue, dead = channel_key(c, 'queue'), channel_key(c, 'dead')
  for from = 0, count - 1, MOVE_STEP do
    local records = redis.call('LRANGE', queue, from, math.min(from + MOVE_STEP, count) - 1)
    for i, record in ipairs(records) do records[i] = dead_entry('overflow', record) end
    call_chunked('RPUSH', dead, records)
  end
end

-- After `n` records were queued: the oldest of each drop-oldest or dead-letter channel
-- past its limit go (dead-lettered ones to its outbox, the channel due `now` in
-- `due_index` so a scanner forwards them), counted in its meta's `overflow_count`.
local function overflow(limits, n, due_index, node, now)
  for _, l in ipairs(limits) do
    local over = l.queued + n - l.depth
    if over > 0 and l.overflow ~= 'reject' then
      if l.overflow == 'dead-letter' then
        dead_letter_oldest(l.c, over)
        due_lower(node, due_index, channel_name(l.c), now)
      end
      redis.call('LTRIM', channel_key(l.c, 'queue'), over, -1)
      redis.call('HINCRBY', channel_key(l.c, 'meta'), 'overflow_count', over)
    end
  end
end
