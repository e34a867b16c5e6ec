-- include: fanout.lua, news.lua, queue.lua, order.lua
-- drop: empty or delete a channel, or a whole topic (nsqd's Channel.Empty,
-- Channel.Delete, Topic.Empty, Topic.Delete). The keys holding the dropped messages
-- are renamed to trash keys, O(1) each, so this one call is the cut: what the target
-- holds now goes, what is published after it stays. The caller frees the trash, at
-- once (UNLINK) or in short chunks (workers/operations.py). Emptying keeps the counters;
-- the topic's id counter always stays, so ids are never reused.
--
-- KEYS[1] topic ids   KEYS[2] topic channels   KEYS[3] topic meta   KEYS[4] backlog
-- KEYS[5] backlog deferred   KEYS[6] topic due index   KEYS[7] topic version (news.lua)
-- KEYS[8] topic history (a deleted topic's goes too; an emptied one's stays)
-- KEYS[9..8+m] m trash keys
-- (as many as there may be keys to detach), then the channels' keys (fanout.lua): the
-- one channel to drop, or for a topic to delete all of its channels
-- ARGV[1..ARG0] the channels (fanout.lua), then: channel name ('' for the topic),
-- 1 to delete or 0 to empty, wake pub/sub channel (a delete announces "!C" for channel
-- C or "!" for the topic, on which brokers close its consumers, as nsqd does; emptying
-- channel C counts one more in its meta field `empties` and announces "~N:C" with that
-- count N, on which brokers free its consumers' in-flight accounting, as nsqd does),
-- the node keys' prefix (lib/node.lua: a dropped channel leaves the node due index too)
-- Returns {the topic's last message id, trash keys used...}, nil when the channel to
-- delete does not exist, or the stale reply.
fanout_begin()
local topic_ids, channels, topic_meta, backlog = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local backlog_deferred, due_index, version, history = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local FIRST_TRASH = 9
local channel, delete = ARGV[ARG0 + 1], ARGV[ARG0 + 2] == '1'
local wake, node = ARGV[ARG0 + 3], ARGV[ARG0 + 4]
local trash, free = {}, FIRST_TRASH
local function detach(key)
  if redis.call('EXISTS', key) == 1 then
    trash[#trash + 1] = KEYS[free]
    free = free + 1
    redis.call('RENAME', key, trash[#trash])
  end
end

-- The messages numbered behind their order keys (lib/order.lua) go with msgs, whose
-- trash counts them (WAITING_FIELD), as the jobs worker reports what it frees.
local function drop_channel(c)
  local waiting = redis.call('HGET', channel_key(c, 'meta'), 'order_waiting')
  for _, suffix in ipairs({'queue', 'inflight', 'deferred', 'msgs', 'gate', 'key_of', 'waiting'}) do
    local kept = #trash
    detach(channel_key(c, suffix))
    if suffix == 'msgs' and waiting and #trash > kept then
      redis.call('HSET', trash[#trash], WAITING_FIELD, waiting)
    end
  end
  local urgent = channel_key(c, 'urgent')     -- lib/queue.lua: its lists go, its counts
  for _, level in ipairs(urgent_levels(urgent)) do detach(urgent_list(urgent, level[1])) end
  redis.call('UNLINK', urgent)
  if not delete then
    -- lib/inflight.lua, lib/queue.lua
    redis.call('HDEL', channel_key(c, 'meta'), 'order_waiting', 'lotted', 'urgent')
  end
  redis.call('ZREM', due_index, channel_name(c))
  node_set(node, due_index, channel_name(c), nil)
  if delete then
    local meta = redis.call('HMGET', channel_key(c, 'meta'), 'max_depth', 'ordered')
    if meta[1] then
      redis.call('HINCRBY', topic_meta, 'limited_channels', -1)   -- lib/limit.lua
    end
    if meta[2] then
      redis.call('HINCRBY', topic_meta, 'ordered_channels', -1)   -- lib/order.lua
    end
    for _, suffix in ipairs({'meta', 'consumers', 'dead', 'dead_lock'}) do
      redis.call('UNLINK', channel_key(c, suffix))
    end
  end
end

if channel ~= '' then
  if delete and redis.call('SREM', channels, channel) == 0 then
    return nil
  end
  drop_channel(1)
else
  if delete then
    local stale = stale_channels(channels)
    if stale then return stale end
  end
  detach(backlog)
  detach(backlog_deferred)
  redis.call('HDEL', topic_meta, 'urgent_backlog')     -- lib/append.lua
  if delete then
    detach(history)
    for c = 1, N_CHANNELS do drop_channel(c) end
    redis.call('UNLINK', channels, topic_meta, due_index)
  end
end
if delete then
  announce(version, wake, '!' .. channel, node)
elseif channel ~= '' and redis.call('SISMEMBER', channels, channel) == 1 then
  local empties = redis.call('HINCRBY', channel_key(1, 'meta'), 'empties', 1)
  announce(version, wake, '~' .. empties .. ':' .. channel, node)
end
return {tonumber(redis.call('GET', topic_ids) or '0'), unpack(trash)}
