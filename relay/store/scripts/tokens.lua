-- tokens: take messages from a rate-limited channel's budget before a deliver call, or
-- give back what a call did not use: one bucket for the channel, on part 0, however many
-- brokers, consumers and parts it has. The bucket is a GCRA kept as one time, refilled by
-- Redis' clock and not by a process: `rate_tat` (ms), the time by which every message
-- taken so far would have gone out at the rate. At time `now` a broker may take k while
-- rate_tat + k * interval <= now + burst * interval (interval = 1000 / rate ms): after
-- a pause up to `burst` go at once, and over any span no more than rate * span + burst.
-- A take waits for at least `least` messages (those asked, the burst and 1/20 s of the
-- rate, whichever is least) rather than take one at a time: a limited channel costs
-- Redis a call to its bucket per 50 ms per broker, not one per message.
--
-- KEYS[1] the channel's meta on part 0
-- ARGV[1] how many to take; a negative count gives that many back
-- Returns {taken, ms until `least` may be taken again (0 when all asked were taken),
-- rate}: rate '' when the channel has no limit, and then taken is what was asked.
local meta = KEYS[1]
local want = tonumber(ARGV[1])
local limit = redis.call('HMGET', meta, 'rate_per_s', 'rate_burst', 'rate_tat')
if not limit[1] then
  return {math.max(want, 0), 0, ''}
end
local rate, burst = tonumber(limit[1]), tonumber(limit[2])
local interval = 1000 / rate
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local tat = math.max(tonumber(limit[3] or '0'), now)
if want < 0 then
  local back = math.max(tat + want * interval, now)
  redis.call('HSET', meta, 'rate_tat', string.format('%.3f', back))
  return {0, 0, limit[1]}
end
local room = math.min(burst, math.floor((now + burst * interval - tat) / interval + 1e-9))
local least = math.min(want, burst, math.max(1, math.floor(rate / 20)))
local taken = room < least and 0 or math.min(want, room)
local after = tat + taken * interval
if taken > 0 then
  redis.call('HSET', meta, 'rate_tat', string.format('%.3f', after))
end
local wait = 0
if taken < want then
  wait = math.max(1, math.ceil(after + (least - burst) * interval - now))
end
return {taken, wait, limit[1]}
