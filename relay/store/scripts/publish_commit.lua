-- include: append.lua, staged.lua
-- publish_commit: the first call of an MPUB too big for one call, whose bodies
-- data_path.py staged in a list just before it; from here it is all or nothing. It
-- checks that the stage is whole (Redis at maxmemory may have refused part of it) and
-- that every `reject` channel has room for all of it (lib/limit.lua), then reserves
-- its ids (INCRBY, its first write: at maxmemory Redis refuses it before anything is
-- written), keeps the stage (no TTL from now on) and records the publish in the part's
-- publishing hash (lib/staged.lua). publish_step.lua then makes the messages visible,
-- a bounded number per call. Refused, it leaves nothing but the stage, which expires.
--
-- KEYS[1..8] as publish.lua's   KEYS[9] the stage (LIST)   KEYS[10] the part's
-- publishing hash; then the channels' keys (fanout.lua)
-- ARGV[1..ARG0] the channels (fanout.lua), then: 8-byte timestamp, defer ms (0 = now),
-- the number of bodies staged, the stage's token
-- Returns the count of the last message, or the stale reply.
-- KEYS[2..8] are lib/append.lua's too, which reads them itself.
local topic_ids, topic_meta, channels = KEYS[1], KEYS[2], KEYS[3]
local stage, publishing_hash = KEYS[9], KEYS[10]
local timestamp, defer = ARGV[ARG0 + 1], tonumber(ARGV[ARG0 + 2])
local n, token = tonumber(ARGV[ARG0 + 3]), ARGV[ARG0 + 4]

local stale = stale_channels(channels)
if stale then return stale end
if redis.call('LLEN', stage) ~= n then
  return redis.error_reply('the MPUB was not staged whole: redis refused part of it')
end
local now = now_ms()
local due = nil
if defer > 0 then due = now + defer end
local p = publishing(due)
if p.limits then
  local full = full_channel(p.limits, n, part_of(topic_meta))
  if full then
    redis.call('DEL', stage)
    return redis.error_reply(full)
  end
end
local last = redis.call('INCRBY', topic_ids, n)
redis.call('PERSIST', stage)
redis.call('HSET', publishing_hash, token,
           marker({next = last - n + 1, last = last, due = due, advanced = now,
                   timestamp = timestamp}))
return last
