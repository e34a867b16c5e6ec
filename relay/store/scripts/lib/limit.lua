-- include: fanout.lua, chunked.lua, record.lua, queue.lua, deadletter.lua, node.lua
-- limit.lua provides channel_limits(), full_channel() and overflow(): the depth limits
-- of a topic's channels (relay-admin limit), which publish.lua reads only when its topic
-- meta counts a limited channel (`limited_channels`), so an unlimited topic pays nothing.
-- A channel's meta holds `max_depth` (the limit as set), `part_max_depth` (this part's
-- share of it: the limit holds per part) and `overflow` (reject, drop-oldest or
-- dead-letter). The depth is what waits to be delivered, as nsqd's depth (in flight
-- and deferred messages are not counted): the queue's length and its urgent counts
-- (lib/queue.lua). Overflow takes the oldest of priority 0 first, then of 1, and so on.
local MOVE_STEP = 1000   -- records dead-lettered per LRANGE

-- {channel number, part's limit, overflow, limit as set, depth} of each limited channel
local function channel_limits(channels)
  local limits = {}
  for c = 1, channels do
    local got = redis.call('HMGET', channel_key(c, 'meta'), 'part_max_depth', 'overflow',
                           'max_depth')
    if got[1] then
      limits[#limits + 1] = {c = c, depth = tonumber(got[1]), overflow = got[2],
                             shown = got[3],
                             queued = redis.call('LLEN', channel_key(c, 'queue'))
                                 + urgent_count(channel_key(c, 'urgent'))}
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

-- The first `count` records of `list` out, to channel c's outbox with `dead`.
local function drop_head(c, list, count, dead)
  for from = 0, dead and count - 1 or -1, MOVE_STEP do
    local records = redis.call('LRANGE', list, from, math.min(from + MOVE_STEP, count) - 1)
    for i, record in ipairs(records) do records[i] = dead_entry('overflow', record) end
    call_chunked('RPUSH', channel_key(c, 'dead'), records)
  end
  if count > 0 then redis.call('LTRIM', list, count, -1) end
end

-- Channel c's `over` oldest ready records of the lowest priorities out, to its outbox
-- with `dead`: the queue's first, then each priority's list from 1 up.
local function drop_oldest(c, over, dead)
  local queue, urgent = channel_key(c, 'queue'), channel_key(c, 'urgent')
  local left = over - math.min(over, redis.call('LLEN', queue))
  drop_head(c, queue, over - left, dead)
  local levels = urgent_levels(urgent)
  for i = #levels, 1, -1 do
    if left == 0 then break end
    local n = math.min(left, levels[i][2])
    drop_head(c, urgent_list(urgent, levels[i][1]), n, dead)
    urgent_taken(urgent, levels[i][1], n)
    left = left - n
  end
end

-- After `n` records were queued: the oldest of each drop-oldest or dead-letter channel
-- past its limit go (dead-lettered ones to its outbox, the channel due `now` in
-- `due_index` so a scanner forwards them), counted in its meta's `overflow_count`.
local function overflow(limits, n, due_index, node, now)
  for _, l in ipairs(limits) do
    local over = l.queued + n - l.depth
    if over > 0 and l.overflow ~= 'reject' then
      drop_oldest(l.c, over, l.overflow == 'dead-letter')
      if l.overflow == 'dead-letter' then
        due_lower(node, due_index, channel_name(l.c), now)
      end
      redis.call('HINCRBY', channel_key(l.c, 'meta'), 'overflow_count', over)
    end
  end
end
