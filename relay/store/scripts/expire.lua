-- include: fanout.lua, time.lua, record.lua, queue.lua, deadletter.lua, node.lua, order.lua
-- expire: the scanner's sweep of expired messages that nobody consumes. From the head
-- of the queue of each of a part's channels with a TTL (ttl_ms in its meta: ttl.lua),
-- the records published before now - TTL go as deliver.lua sends them when it pops
-- them: one already delivered max-attempts times to the outbox as a plain entry
-- (dead_count), the others to the outbox tagged `expired` when the channel has a
-- dead-letter topic (max attempts in force, or a dead_letter_topic of its own), else
-- dropped (expired_count counts both); the channel is then due at once, so a scanner
-- forwards its letters. A paused channel is left alone, as deliver.lua leaves it. A
-- queue is in publish order but for the messages requeued to its tail, so the sweep
-- stops at the first live record: an expired one behind it goes when it is delivered.
-- A channel's urgent messages (lib/queue.lua) are swept the same way, each priority's
-- list from its head.
-- On an ordered channel what goes releases its order key (lib/order.lua).
--
-- KEYS[1] topic meta   KEYS[2] topic channels   KEYS[3] topic due index   KEYS[4] topic
-- version (lib/news.lua), then the channels' keys (fanout.lua)
-- ARGV[1..ARG0] the channels (fanout.lua), then: the most records to expire in this
-- call, the scanner's max attempts (0: unlimited; a channel's max_attempts wins), the
-- node keys' prefix (node.lua), the wake pub/sub channel
-- Returns {taken out, more}: more is 1 when the call stopped at its bound (`most`).
fanout_begin()
local channels, due_index, version = KEYS[2], KEYS[3], KEYS[4]
local most, max_attempts, node = tonumber(ARGV[ARG0 + 1]), ARGV[ARG0 + 2], ARGV[ARG0 + 3]
local wake = ARGV[ARG0 + 4]
local STEP = 100   -- records read per LRANGE

local stale = stale_channels(channels)
if stale then return stale end
local now = now_ms()
local total, more = 0, 0

-- The ready records of channel c as sources: the queue, and if its meta says it may
-- hold some, the list of each priority with messages waiting (lib/queue.lua); read(want)
-- gives a source's first records, cut(n) takes its first n out.
local function sources(c, urgent)
  local function list_source(list, p)
    return {read = function(want) return redis.call('LRANGE', list, 0, want - 1) end,
            cut = function(n)
              redis.call('LTRIM', list, n, -1)
              if p then urgent_taken(channel_key(c, 'urgent'), p, n) end
            end}
  end
  local out = {list_source(channel_key(c, 'queue'))}
  for _, level in ipairs(urgent and urgent_levels(channel_key(c, 'urgent')) or {}) do
    out[#out + 1] = list_source(urgent_list(channel_key(c, 'urgent'), level[1]), level[1])
  end
  return out
end

-- The expired records at the head of one source of channel c (o: its gate), at most
-- `most`, out of it: how many expired, how many were spent (delivered max_attempts
-- times already), and true if it stopped at `most`.
local function expire_head(c, o, source, most, oldest_live, attempts, dead_letters)
  local expired, spent = 0, 0
  while expired + spent < most do
    local want = math.min(STEP, most - expired - spent)
    local records = source.read(want)
    local n, dead, left = 0, {}, {}
    while n < #records and timestamp_ms(records[n + 1]) < oldest_live do
      n = n + 1
      local r = records[n]
      left[n] = record_id(r)
      if attempts > 0 and record_attempts(r) >= attempts then
        dead[#dead + 1], spent = r, spent + 1
      elseif dead_letters then
        dead[#dead + 1], expired = dead_entry('expired', r), expired + 1
      else
        expired = expired + 1
      end
    end
    if #dead > 0 then redis.call('RPUSH', channel_key(c, 'dead'), unpack(dead)) end
    if n > 0 then source.cut(n) end
    local released = order_release(o, left)
    -- a live record, or the source's end (but for the messages the expired ones released)
    if n < #records or (n < want and released == 0) then return expired, spent, false end
  end
  return expired, spent, true
end

for c = 1, N_CHANNELS do
  local meta = channel_key(c, 'meta')
  local got = redis.call('HMGET', meta, 'ttl_ms', 'max_attempts', 'dead_letter_topic',
                         'paused', 'urgent')
  local ttl = tonumber(got[1] or '0')
  if ttl > 0 and not got[4] and most > 0 then
    local attempts = tonumber(got[2] or max_attempts)
    local dead_letters = attempts > 0 or got[3] ~= false
    local o = order_gate(channel_key(c, 'queue'), channel_key(c, 'deferred'),
                         channel_key(c, 'msgs'), meta, channel_key(c, 'gate'),
                         channel_key(c, 'key_of'), channel_key(c, 'waiting'),
                         channel_key(c, 'urgent'), due_index, version, channel_name(c),
                         wake, node)
    local expired, spent = 0, 0
    for _, source in ipairs(sources(c, got[5])) do
      local e, s, stopped = expire_head(c, o, source, most - expired - spent, now - ttl,
                                        attempts, dead_letters)
      expired, spent = expired + e, spent + s
      if stopped then
        more = 1
        break
      end
    end
    if expired > 0 then redis.call('HINCRBY', meta, 'expired_count', expired) end
    if spent > 0 then redis.call('HINCRBY', meta, 'dead_count', spent) end
    if spent > 0 or (dead_letters and expired > 0) then
      due_lower(node, due_index, channel_name(c), now)
    end
    total, most = total + expired + spent, most - expired - spent
  elseif ttl > 0 and not got[4] then
    more = 1
  end
end
return {total, more}
