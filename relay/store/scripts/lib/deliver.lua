-- include: time.lua, chunked.lua, record.lua, queue.lua, inflight.lua, node.lua, deadletter.lua, order.lua
-- deliver.lua provides deliver_channel(): pop ready messages of one channel for this
-- broker's clients and put them in flight (lib/inflight.lua), in one go for all of
-- them. deliver.lua runs it for one channel, after the FINs folded into its call;
-- deliver_many.lua for several channels of one topic part (a wake-up of a topic that
-- has many channels on this broker: one call, not one per channel).
-- Each group is one client with its own msg_timeout. A record goes in flight as it
-- was queued: its attempts count the deliveries before this one, the broker adds this
-- one (codec.delivered), and a requeue writes it in (lib/queue.lua).
-- A message already delivered max-attempts times goes to the channel's dead-letter
-- outbox instead (the scanner forwards it to the dead-letter topic), and the
-- group gets the next one. So does a message older than the channel's TTL (field
-- ttl_ms, from its publish timestamp, by Redis time): it goes to the outbox tagged
-- `expired` if the channel has a dead-letter topic (max attempts in force, or a
-- dead_letter_topic of its own), else it is dropped; expired_count counts both.
--
-- c: the channel's gate (lib/order.lua's order_gate(): what is finished, dead-lettered
-- or expired releases its order key) with its other keys inflight =, meta = and dead =
-- (the dead-letter outbox); c.urgent the counts of its messages of priority 1-9,
-- which go first (lib/queue.lua). The meta hash: a paused channel delivers nothing; its
-- max_attempts field overrides `max_attempts` (0: unlimited); ttl_ms,
-- dead_letter_topic: above. args[first..last]: groups of 4: owner, timeout ms, count,
-- most bytes (0: any).
-- `taken`: whether the broker took the groups' counts from the channel's rate limit
-- (tokens.lua) first; a channel with a rate limit (field rate_per_s) delivers nothing to
-- a call that did not.
-- Returns one list of records per group, the channel's count of empties (drop.lua,
-- which tells the broker whether the records predate an empty), 1 if the queue still
-- has messages, else 0 (the broker then waits for a wake-up), 1 if the channel is
-- ordered, else 0 (the broker then folds a FIN into the deliver call that may take the
-- message it releases: relay/broker/settling.py), and 1 if it has a rate limit, else 0
-- (the broker then takes from it before each call: relay/broker/channel.py), and where
-- `lots` (data layout 4 in force) put groups of 2 to LOT_MAX records in flight as lots
-- (lib/inflight.lua), each group's lot name ('' for one not in a lot), else an empty
-- list.
-- c.version: the topic part's version hash, which numbers the lots (lot_named).

-- the channel's controls in one read: what every call needs, read where it is kept
local function deliver_channel(c, max_attempts, args, first, last, taken, lots)
  local out = {}
  local meta = redis.call('HMGET', c.meta, 'empties', 'paused', 'max_attempts', 'ttl_ms',
                          'dead_letter_topic', 'ordered', 'rate_per_s', 'urgent')
  local empties = tonumber(meta[1] or '0')
  local ordered = meta[6] and 1 or 0
  local limited = meta[7] and 1 or 0
  local urgent = meta[8]
  -- 1 if the channel has messages ready, else 0
  local function more()
    if urgent then return math.min(redis.call('EXISTS', c.queue, c.urgent), 1) end
    return redis.call('EXISTS', c.queue)
  end
  if meta[2] or (limited == 1 and not taken) then
    for g = first, last, 4 do out[#out + 1] = {} end
    return out, empties, meta[2] and 0 or more(), ordered, limited, {}
  end

  local now = now_ms()
  max_attempts = tonumber(meta[3] or max_attempts)
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
  -- up to `want` ready records: the urgent ones first, highest priority first
  local function take(want)
    if not urgent then return redis.call('LPOP', c.queue, want) end
    local records = take_urgent(c, want)
    if #records < want then
      for _, r in ipairs(redis.call('LPOP', c.queue, want - #records) or {}) do
        records[#records + 1] = r
      end
    end
    return #records > 0 and records
  end
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
      local popped = take(want)
      if not popped then break end
      for i, r in ipairs(popped) do
        if max_bytes > 0 and #records > 0 and bytes + #r > max_bytes then
          local rest = {}
          for j = #popped, i, -1 do rest[#rest + 1] = popped[j] end
          enqueue(c, rest, true)
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
  local msgs, inflight, n, lotted = {}, {}, 0, 0
  local names, numbered = {}, nil     -- each group's lot ('' none); the last lot number
  for g = first, last, 4 do
    local deadline = now + tonumber(args[g + 1])
    local owner = args[g]
    local records = pop(tonumber(args[g + 2]), tonumber(args[g + 3]))
    local lot = ''
    if lots and #records > 1 and #records <= LOT_MAX then
      if not numbered then    -- a number for each group, taken once
        local groups = (last - first + 1) / 4
        numbered = redis.call('HINCRBY', c.version, 'lots', groups) - groups
      end
      numbered = numbered + 1
      lot = lot_named(numbered)
      lot_fields(msgs, lot, records)
      inflight[n + 1], inflight[n + 2] = deadline, lot .. ' ' .. owner
      n, lotted = n + 2, lotted + #records - 1
    else
      for _, r in ipairs(records) do
        local id = record_id(r)
        msgs[#msgs + 1], msgs[#msgs + 2] = id, r
        inflight[n + 1], inflight[n + 2] = deadline, in_flight_member(id, owner)
        n = n + 2
      end
    end
    if #records > 0 and (not earliest or deadline < earliest) then earliest = deadline end
    out[#out + 1] = records
    names[#out] = lot
  end
  if n > 0 then
    call_chunked('HSET', c.msgs, msgs)
    call_chunked('ZADD', c.inflight, inflight)
  end
  if lotted > 0 then
    redis.call('HINCRBY', c.meta, 'lotted', lotted)
  end
  if spent > 0 then
    redis.call('HINCRBY', c.meta, 'dead_count', spent)
  end
  if expired > 0 then
    redis.call('HINCRBY', c.meta, 'expired_count', expired)
  end
  if #dead > 0 then
    call_chunked('RPUSH', c.dead, dead)
    earliest = now
  end
  if earliest then
    due_lower(c.node, c.due_index, c.channel, earliest)
  end
  order_release(c, left)
  return out, empties, more(), ordered, limited, numbered and names or {}
end
