-- include: append.lua, staged.lua, wide.lua
-- publish_commit: the first call of an MPUB too big for one call, whose bodies
-- data_path.py staged in a list just before it; from here it is all or nothing. It
-- checks that the stage is whole (Redis at maxmemory may have refused part of it) and
-- that every `reject` channel has room for all of it (lib/limit.lua), then reserves
-- its ids (INCRBY, its first write: at maxmemory Redis refuses it before anything is
-- written), keeps the stage (no TTL from now on) and records the publish in the part's
-- publishing hash (lib/staged.lua). publish_step.lua then makes the messages visible,
-- a bounded number per call. Refused, it leaves nothing but the stage, which expires.
--
-- Asked to go wide (lib/wide.lua) and the part has more channels than that asks, none
-- limited or ordered, it names no channel, checks none, and starts the first message's
-- snapshot instead.
--
-- KEYS[1..8] as publish.lua's   KEYS[9] the stage (LIST)   KEYS[10] the part's
-- publishing hash   KEYS[11] the wide publish's snapshot (LIST); then the channels'
-- keys (fanout.lua)
-- ARGV[1..ARG0] the channels (fanout.lua), then: 8-byte timestamp, defer ms (0 = now),
-- the number of bodies staged, the stage's token, the part's number (keys.py), the
-- channels above which it goes wide (0: never), a wide step's slice of channels
-- Returns the count of the last message, or the stale reply; wide, {the count of the
-- last message, the first slice's names...}.
-- KEYS[2..8] are lib/append.lua's too, which reads them itself.
fanout_begin()
local topic_ids, topic_meta, channels = KEYS[1], KEYS[2], KEYS[3]
local stage, publishing_hash, snapshot = KEYS[9], KEYS[10], KEYS[11]
local timestamp, defer = ARGV[ARG0 + 1], tonumber(ARGV[ARG0 + 2])
local n, token = tonumber(ARGV[ARG0 + 3]), ARGV[ARG0 + 4]
local part, wide_above, slice = tonumber(ARGV[ARG0 + 5]), tonumber(ARGV[ARG0 + 6]),
                                tonumber(ARGV[ARG0 + 7])

local wide = wide_above > 0 and wide_eligible(wide_above)
if not wide then
  local stale = stale_channels(channels)
  if stale then return stale end
end
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
local m = {next = last - n + 1, last = last, due = due, advanced = now, timestamp = timestamp}
redis.call('HSET', publishing_hash, token, marker(m))
if wide and wide_start(m, snapshot, stage, part) then
  return {last, unpack(wide_slice(snapshot, slice))}
end
return last
