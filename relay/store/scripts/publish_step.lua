-- include: append.lua, staged.lua, wide.lua
-- publish_step: the next messages of a committed staged publish (publish_commit.lua)
-- made visible, as publish.lua makes a call's: to the channels the topic has at this
-- step, or its backlog, with their counts and wake-up. A step takes at most
-- STEP_COPIES record copies (a message makes one per channel, one more with retention
-- on) and STEP_BYTES bytes of copies (one message at least), so no call holds Redis
-- long whatever the MPUB. It reads where the publish stands from its marker
-- (lib/staged.lua) and takes its bodies off the stage's head, atomically: steps sent
-- by two processes (its broker and a scanner finishing it) never publish a message
-- twice. Committed, a publish must finish: past Redis' maxmemory too.
--
-- A wide publish (its snapshot exists: lib/wide.lua) goes a slice of channels a step.
--
-- KEYS[1..8] as publish.lua's   KEYS[9] the stage (LIST)   KEYS[10] the part's
-- publishing hash   KEYS[11] the wide publish's snapshot (LIST); then the channels'
-- keys (fanout.lua)
-- ARGV[1..ARG0] the channels (fanout.lua), then: wake pub/sub channel, the part's
-- number (keys.py), the node keys' prefix (lib/node.lua), the stage's token, a wide
-- step's slice of channels
-- Returns {messages published, messages left} ({0, 0}: another call finished it), or
-- the stale reply; a wide step, the next slice's names after those two.
-- KEYS[2..8] are lib/append.lua's too, which reads them itself.
fanout_begin()
local topic_ids, channels, stage, publishing_hash = KEYS[1], KEYS[3], KEYS[9], KEYS[10]
local snapshot = KEYS[11]
local wake, part = ARGV[ARG0 + 1], tonumber(ARGV[ARG0 + 2])
local node, token, slice = ARGV[ARG0 + 3], ARGV[ARG0 + 4], tonumber(ARGV[ARG0 + 5])
local STEP_COPIES, STEP_BYTES = 1000, 262144
local TAKE = 500    -- bodies read from the stage at a time

if redis.call('EXISTS', snapshot) == 1 then
  local value = redis.call('HGET', publishing_hash, token)
  if not value then return {0, 0} end
  return wide_steps(read_marker(value), publishing_hash, token, snapshot, stage, slice,
                    part, wake, node)
end
local stale = stale_channels(channels)
if stale then return stale end
local value = redis.call('HGET', publishing_hash, token)
if not value then return {0, 0} end
local m = read_marker(value)
local p = publishing(m.due)
local copies = math.max(p.channels, 1) + (p.history and 1 or 0)
local most = math.min(math.max(1, math.floor(STEP_COPIES / copies)), m.last - m.next + 1)
local most_bytes = STEP_BYTES / copies
local bodies, bytes, full = {}, 0, false
while #bodies < most and not full do
  local got = redis.call('LRANGE', stage, #bodies, #bodies + math.min(TAKE, most - #bodies) - 1)
  if #got == 0 then break end
  for _, body in ipairs(got) do
    full = #bodies > 0 and bytes + #body > most_bytes
    if full then break end
    bodies[#bodies + 1] = body
    bytes = bytes + #body
  end
end
if #bodies == 0 then
  redis.call('HDEL', publishing_hash, token)
  return redis.error_reply('the staged MPUB ' .. token .. ' lost its stage')
end
redis.call('LTRIM', stage, #bodies, -1)
append(p, m.next, bodies, m.timestamp, part)
appended(p, #bodies, bytes, wake, node)
m.next = m.next + #bodies
local left = m.last - m.next + 1
if left == 0 then
  redis.call('HDEL', publishing_hash, token)
  redis.call('DEL', stage)
else
  m.advanced = now_ms()
  redis.call('HSET', publishing_hash, token, marker(m))
end
return {#bodies, left}
