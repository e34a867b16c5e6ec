-- include: time.lua, inflight.lua, queue.lua, news.lua
-- scan: the scanner's move for one channel. In-flight messages past their
-- deadline go back to the queue (a timeout, as nsqd's processInFlightQueue),
-- deferred messages that are due join the queue (processDeferredQueue), and the
-- channel's entry in the due index is set to its next deadline, or removed.
-- Being one script, two scanners can never requeue the same message twice.
--
-- KEYS[1] queue   KEYS[2] inflight   KEYS[3] msgs   KEYS[4] deferred   KEYS[5] channel meta
-- KEYS[6] topic due index   KEYS[7] dead-letter outbox (while it holds messages the
-- channel is due every second, so a scanner forwards them even after a failed attempt)
-- KEYS[8] topic version (news.lua)   KEYS[9] urgent (lib/queue.lua)
-- ARGV[1] channel name (also its member in the due index)   ARGV[2] wake pub/sub channel
-- ARGV[3] at most this many messages of each kind per call   ARGV[4] the node keys' prefix
-- (node.lua): the channel's entry in the node due index is set as in the topic's
-- Returns {timed out, promoted, next due ms or CODE.NO_TIME, messages in the dead-letter
-- outbox}.
local queue, inflight, msgs, deferred = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local channel_meta, due_index, outbox, version = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local channel, wake, limit, node = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local q = {queue = queue, urgent = KEYS[9], meta = channel_meta}

local now = now_ms()

local k = {inflight = inflight, msgs = msgs, deferred = deferred, meta = channel_meta}

-- In-flight members past their deadline back to the queue, up to `limit` messages (or
-- the first lot's, if more); how many messages.
local function time_out()
  local ids, members = held_ids(k, redis.call('ZRANGEBYSCORE', inflight, '-inf', now,
                                              'LIMIT', 0, limit), limit)
  back_to_queue(q, msgs, ids, true)
  release(k, ids, members, true)
  return #ids
end

-- Up to `limit` deferred messages that are due into the queue; how many.
local function promote()
  local ids = redis.call('ZRANGEBYSCORE', deferred, '-inf', now, 'LIMIT', 0, limit)
  back_to_queue(q, msgs, ids)
  call_chunked('ZREM', deferred, ids)
  return #ids
end

local timed_out = time_out()
local promoted = promote()
if timed_out > 0 then
  redis.call('HINCRBY', channel_meta, 'timeout_count', timed_out)
end
if timed_out + promoted > 0 then
  announce(version, wake, channel, node)
end

local next_due = CODE.NO_TIME
for _, zset in ipairs({inflight, deferred}) do
  local first = redis.call('ZRANGE', zset, 0, 0, 'WITHSCORES')
  if #first > 0 and (next_due == CODE.NO_TIME or tonumber(first[2]) < next_due) then
    next_due = tonumber(first[2])
  end
end
local dead = redis.call('LLEN', outbox)
if dead > 0 and (next_due == CODE.NO_TIME or next_due > now + 1000) then
  next_due = now + 1000
end
if next_due == CODE.NO_TIME then
  redis.call('ZREM', due_index, channel)
  node_set(node, due_index, channel, nil)
else
  redis.call('ZADD', due_index, next_due, channel)
  node_set(node, due_index, channel, next_due)
end
return {timed_out, promoted, next_due, dead}
