-- include: append.lua, staged.lua
-- wide.lua provides wide_start(), wide_slice() and wide_steps(): a committed staged
-- publish (publish_commit.lua) to a topic part of many channels, made visible one
-- message and one slice of its channels per call (publish_step.lua), so that no call
-- holds Redis for longer than a slice's appends whatever the number of channels. Each
-- message goes to the channels the topic had when it started: a copy of the topic's
-- channel set, the publish's snapshot (keys.py: the stage's key with ":channels"),
-- from which each step takes the slice it was given: a caller names the slice's
-- channels (fanout.lua's layout) as the last reply told it, and a step given channels
-- that are not all still in the snapshot (another process did some) does nothing but
-- name a slice that is. A channel deleted since the snapshot is skipped; one made
-- since does not get the message (nsqd's channels get what is published after they
-- are). The snapshot is the wide publish's mark: while it exists, the steps go by
-- slices; a release that does not know it (a rolling upgrade's older scanner finishing
-- a stalled publish) sends the message again to every channel: duplicates, no loss.
-- A topic part whose channels are depth-limited or ordered, or which is paused, is
-- published by the plain steps (all its channels per call): wide_eligible says so.
local SNAPSHOT_TTL_MS = 86400000  -- a stalled wide publish is finished within seconds

-- Whether the topic part (KEYS[2] meta, KEYS[3] channels) publishes by slices: more
-- than `threshold` channels, none limited or ordered, not paused.
local function wide_eligible(threshold)
  local meta = redis.call('HMGET', KEYS[2], 'paused', 'limited_channels', 'ordered_channels')
  if meta[1] or (meta[2] and meta[2] ~= '0') or (meta[3] and meta[3] ~= '0') then
    return false
  end
  return redis.call('SCARD', KEYS[3]) > threshold
end

-- Message m.next starts: its snapshot of the topic's channels, and what is done once a
-- message (the history's copy, the topic's counts). False, with no snapshot, when the
-- topic has no channel left: the plain steps publish the rest (to the backlog).
local function wide_start(m, snapshot, stage, part)
  if redis.call('SUNIONSTORE', snapshot, KEYS[3]) == 0 then return false end
  redis.call('PEXPIRE', snapshot, SNAPSHOT_TTL_MS)
  local body = redis.call('LINDEX', stage, 0)
  local p = publishing(nil)
  if p.history then
    local size = p.history.size
    local record = new_record(m.timestamp, message_id(part, m.next), body, m.next)
    local added = retain(KEYS[8], p.history, m.timestamp, {record}, {m.next})
    trim_history(KEYS[8], p.history, now_ms(), TRIM_ENTRIES + added,
                 TRIM_BYTES + p.history.size - size,
                 math.min(TRIM_SLACK_MOST, math.floor(p.history.ms * TRIM_SLACK)))
    save_history(KEYS[2], p.history)
  end
  redis.call('HINCRBY', KEYS[2], 'message_count', 1)
  redis.call('HINCRBY', KEYS[2], 'message_bytes', #body)
  return true
end

-- A slice that may come next: `size` names of the snapshot (all, if fewer).
local function wide_slice(snapshot, size)
  return redis.call('SRANDMEMBER', snapshot, size)
end

-- Whether the channels the caller named (fanout.lua) are a slice still to do: at most
-- `size`, all in the snapshot.
local function given_slice(snapshot, size)
  if N_CHANNELS == 0 or N_CHANNELS > size then return false end
  for i = 1, N_CHANNELS do
    if redis.call('SISMEMBER', snapshot, channel_name(i)) == 0 then return false end
  end
  return true
end

-- Message m.next queued (or deferred to m.due) in the named channels still in the topic.
local function wide_append(m, body, part, node)
  local id = message_id(part, m.next)
  local record = new_record(m.timestamp, id, body, m.next)
  for c = 1, N_CHANNELS do
    if redis.call('SISMEMBER', KEYS[3], channel_name(c)) == 1 then
      if m.due then
        redis.call('HSET', channel_key(c, 'msgs'), id, record)
        redis.call('ZADD', channel_key(c, 'deferred'), m.due, id)
        due_lower(node, KEYS[6], channel_name(c), m.due)
      else
        redis.call('RPUSH', channel_key(c, 'queue'), record)
      end
      redis.call('HINCRBY', channel_key(c, 'meta'), 'message_count', 1)
    end
  end
end

-- One step of a wide publish whose marker is `m`: the slice named, if it is the next,
-- then the next message started when this one reached its last channel. Returns
-- {messages finished, messages left, the next slice's names...}; messages left and no
-- names: the plain steps go on (the topic has no channel left).
local function wide_steps(m, publishing_hash, token, snapshot, stage, size, part, wake, node)
  if not given_slice(snapshot, size) then
    return {0, m.last - m.next + 1, unpack(wide_slice(snapshot, size))}
  end
  local body = redis.call('LINDEX', stage, 0)
  if not body then
    redis.call('HDEL', publishing_hash, token)
    redis.call('DEL', snapshot)
    return redis.error_reply('the staged MPUB ' .. token .. ' lost its stage')
  end
  wide_append(m, body, part, node)
  local done = {}
  for i = 1, N_CHANNELS do done[i] = channel_name(i) end
  redis.call('SREM', snapshot, unpack(done))
  if redis.call('EXISTS', snapshot) == 1 then
    m.advanced = now_ms()
    redis.call('HSET', publishing_hash, token, marker(m))
    return {0, m.last - m.next + 1, unpack(wide_slice(snapshot, size))}
  end
  if not m.due then
    announce(KEYS[7], wake, '', node)
  end
  redis.call('LPOP', stage)
  m.next = m.next + 1
  if m.next > m.last then
    redis.call('HDEL', publishing_hash, token)
    redis.call('DEL', stage)
    return {1, 0}
  end
  m.advanced = now_ms()
  redis.call('HSET', publishing_hash, token, marker(m))
  if not wide_start(m, snapshot, stage, part) then
    return {1, m.last - m.next + 1}
  end
  return {1, m.last - m.next + 1, unpack(wide_slice(snapshot, size))}
end
