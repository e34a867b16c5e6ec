-- include: time.lua, chunked.lua, record.lua, finish.lua, node.lua, deadletter.lua
-- deliver: finish the FINs folded in, then pop ready messages of one channel for this
-- broker's clients and put them in flight (lib/inflight.lua), in one call for all of
-- them. Each group is one client with its own msg_timeout. A record goes in flight as it
-- was queued: its attempts count the deliveries before this one, the broker adds this
-- one (codec.delivered), and a requeue writes it in (lib/queue.lua).
-- A message already delivered max-attempts times goes to the channel's dead-letter
-- outbox instead (the scanner forwards it to the dead-letter topic), and the
-- group gets the next one. So does a message older than the channel's TTL (field
-- ttl_ms, from its publish timestamp, by Redis time): it goes to the outbox tagged
-- `expired` if the channel has a dead-letter topic (max attempts in force, or a
-- dead_letter_topic of its own), else it is dropped; expired_count counts both.
--
-- KEYS[1] queue   KEYS[2] inflight   KEYS[3] msgs   KEYS[4] topic due index
-- KEYS[5] channel meta (a paused channel delivers nothing; its max_attempts field
-- overrides ARGV[2]; ttl_ms, dead_letter_topic: above)   KEYS[6] dead-letter outbox
-- KEYS[7] deferred   KEYS[8] gate   KEYS[9] key_of   KEYS[10] waiting (lib/order.lua: what
-- is finished, dead-lettered or expired releases its order key)
-- KEYS[11] topic version (lib/news.lua)
-- ARGV[1] channel name (its member in the due index)   ARGV[2] max attempts (0: unlimited)
-- ARGV[3] F, then F pairs to finish first: owner, id (the group commit folds the FINs
-- of this channel that precede the call into it: one call frees credit and uses it)
-- then groups of 4: owner, timeout ms, count, most bytes (0: any), then last the wake
-- pub/sub channel and the node keys' prefix (node.lua)
-- Returns one list of records per group, in ARGV order, then the channel's count of
-- empties (drop.lua), which tells the broker whether the records predate an empty,
-- then the finish codes (finish.lua's), one per pair, then 1 if the queue still has
-- messages, else 0 (the broker then waits for a wake-up instead of asking again).

local groups = 4 + 2 * tonumber(ARGV[3])
local LAST_GROUP = #ARGV - 2
local k = {inflight = KEYS[2], msgs = KEYS[3], deferred = KEYS[7]}
local o = {queue = KEYS[1], gate = KEYS[8], key_of = KEYS[9], waiting = KEYS[10],
           msgs = KEYS[3], deferred = KEYS[7], due_index = KEYS[4], version = KEYS[11],
           channel = ARGV[1], wake = ARGV[#ARGV - 1], node = ARGV[#ARGV]}
local finished = finish_pairs(k, ARGV, 4, groups - 1, o)
local out = {}
-- the channel's controls in one read: what every call needs, read where it is kept
local meta = redis.call('HMGET', KEYS[5], 'empties', 'paused', 'max_attempts', 'ttl_ms',
                        'dead_letter_topic')
local empties = tonumber(meta[1] or '0')
if meta[2] then
  for g = groups, LAST_GROUP, 4 do out[#out + 1] = {} end
  out[#out + 1] = empties
  out[#out + 1] = finished
  out[#out + 1] = 0
  return out
end

local now = now_ms()
local max_attempts = tonumber(meta[3] or ARGV[2])
local ttl = tonumber(meta[4] or '0')
local oldest_live = now - ttl     -- with a TTL, a message published before this expired
local dead_letters = max_attempts > 0 or meta[5] ~= false
local dead, spent, expired = {}, 0, 0   -- outbox entries; past max attempts; expired
local left = {}                         -- the ids of those, which leave the channel

-- Up to `count` records that may still be delivered, oldest first, of no more than
-- `max_bytes` together (0: no limit) unless the first alone is more: a consumer's
-- unsent bytes are bounded before its messages leave Redis, not after. With a bound,
-- the queue is popped a few records at a time (as many as fit if they are the size
-- of the largest seen, at most POP_BATCH), and what was popped past it goes back.
local POP_BATCH = 64
local function pop(count, max_bytes)
  local records, bytes, largest = {}, 0, 0
  while count > 0 and (max_bytes == 0 or bytes < max_bytes) do
    local want = count
    if max_bytes > 0 then
      want = 1
      if largest > 0 then
        want = math.max(1, math.min(count, POP_BATCH, math.floor((max_bytes - bytes) / largest)))
      end
    end
    local popped = redis.call('LPOP', KEYS[1], want)
    if not popped then break end
    for i, r in ipairs(popped) do
      if max_bytes > 0 and #records > 0 and bytes + #r > max_bytes then
        local rest = {}
        for j = #popped, i, -1 do rest[#rest + 1] = popped[j] end
        call_chunked('LPUSH', KEYS[1], rest)
        return records
      end
      largest = math.max(largest, #r)
      if max_attempts > 0 and record_attempts(r) >= max_attempts then
        dead[#dead + 1] = r
        spent = spent + 1
        left[#left + 1] = record_id(r)
      elseif ttl > 0 and timestamp_ms(r) < oldest_live then
        expired = expired + 1
        left[#left + 1] = record_id(r)
        if dead_letters then dead[#dead + 1] = dead_entry('expired', r) end
      else
        records[#records + 1] = r
        bytes = bytes + #r
        count = count - 1
      end
    end
  end
  return records
end

-- every group's records go in flight with one HSET and one ZADD
local earliest = nil
local msgs, inflight, n = {}, {}, 0
for g = groups, LAST_GROUP, 4 do
  local deadline = now + tonumber(ARGV[g + 1])
  local owner = ARGV[g]
  local records = pop(tonumber(ARGV[g + 2]), tonumber(ARGV[g + 3]))
  for _, r in ipairs(records) do
    local id = record_id(r)
    msgs[n + 1], msgs[n + 2] = id, r
    inflight[n + 1], inflight[n + 2] = deadline, in_flight_member(id, owner)
    n = n + 2
  end
  if #records > 0 and (not earliest or deadline < earliest) then earliest = deadline end
  out[#out + 1] = records
end
if n > 0 then
  call_chunked('HSET', KEYS[3], msgs)
  call_chunked('ZADD', KEYS[2], inflight)
end
if spent > 0 then
  redis.call('HINCRBY', KEYS[5], 'dead_count', spent)
end
if expired > 0 then
  redis.call('HINCRBY', KEYS[5], 'expired_count', expired)
end
if #dead > 0 then
  call_chunked('RPUSH', KEYS[6], dead)
  earliest = now
end
if earliest then
  due_lower(ARGV[#ARGV], KEYS[4], ARGV[1], earliest)
end
order_release(o, left)
out[#out + 1] = empties
out[#out + 1] = finished
out[#out + 1] = redis.call('EXISTS', KEYS[1])
return out
