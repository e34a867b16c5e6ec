-- include: chunked.lua, record.lua
-- queue.lua provides enqueue(), back_to_queue() and count_delivery().
--
-- A channel's ready messages (q: {queue =, urgent =, meta =}, its keys) are its queue,
-- a LIST, and for messages of priority 1-9 (data layout 5: the first digit of the id,
-- lib/record.lua) its urgent ZSET, scored by urgent_score(): ZPOPMIN takes the highest
-- priority first and, within one, the first published (a part's ids count up, and a
-- channel's keys are one part's), so a requeued urgent message goes back to its place.
-- The meta's
-- field `urgent` (set with the first urgent record, never cleared but by an empty)
-- makes deliver calls look at the ZSET; a channel that never had one pays nothing.
--
-- A record in flight does not count its delivery yet (deliver.lua leaves it as queued;
-- the broker adds it to what it sends), so whatever takes a message out of flight
-- without a FIN writes it in.

-- A score per priority: the count an id ends with is below 2^48 (12 hex digits), so
-- count - priority * SPAN orders by priority, then count, exactly in a double.
local PRIORITY_SPAN = 281474976710656     -- 2^48

-- (a number: redis.call writes it exactly, where Lua's own tostring would round it);
-- `count` if the caller knows it, else read from the record's id
local function urgent_score(record, priority, count)
  return (count or tonumber(string.sub(record, -13, -2), 16)) - priority * PRIORITY_SPAN
end

-- The scores of priority p's messages: min, max for ZRANGEBYSCORE and ZCOUNT.
local function priority_scores(p)
  return -p * PRIORITY_SPAN, (1 - p) * PRIORITY_SPAN - 1
end

-- enqueue(): records made ready go to the tail of the queue (to its head with `front`,
-- the first given ending up last: records popped and given back in reverse), or by
-- priority into the urgent ZSET. Returns true if the channel had nothing ready before
-- them, as far as one reply shows (a broker waits for the wake-up then). `counts`: the
-- count each record's id ends with, where the caller has them (a publish).
local function enqueue(q, records, front, counts)
  if #records == 0 then return false end
  local plain, urgent = records, nil
  for i, r in ipairs(records) do
    if record_priority(r) ~= 0 then
      plain, urgent = {}, {}
      for j = 1, i - 1 do plain[j] = records[j] end
      for j = i, #records do
        local priority = record_priority(records[j])
        if priority == 0 then
          plain[#plain + 1] = records[j]
        else
          local n = #urgent
          urgent[n + 1] = urgent_score(records[j], priority, counts and counts[j])
          urgent[n + 2] = records[j]
        end
      end
      break
    end
  end
  local fresh = false
  if #plain > 0 then
    local length = call_chunked(front and 'LPUSH' or 'RPUSH', q.queue, plain)
    fresh = length[#length] == #plain
  end
  if urgent then
    call_chunked('ZADD', q.urgent, urgent)
    redis.call('HSET', q.meta, 'urgent', 1)
    fresh = fresh or redis.call('ZCARD', q.urgent) * 2 == #urgent
  end
  return fresh
end

-- back_to_queue(): messages whose records are in a channel's msgs hash (in flight or
-- deferred) are made ready (enqueue()), in the order of `ids`, out of the msgs hash;
-- one command per CHUNK ids. With `in_flight` they come out of flight, so each record
-- counts its delivery first; without, they were deferred. The caller takes them out of
-- their ZSET (release() for in-flight ones). requeue.lua, reap.lua and scan.lua use it.
-- An id whose record is gone is only removed.
local function counted(record)
  return with_attempts(record, math.min(record_attempts(record) + 1, 65535))
end

local function back_to_queue(q, msgs, ids, in_flight)
  local records = {}
  for _, reply in ipairs(call_chunked('HMGET', msgs, ids)) do
    for _, value in ipairs(reply) do
      if value then
        records[#records + 1] = in_flight and counted(value) or value
      end
    end
  end
  enqueue(q, records)
  call_chunked('HDEL', msgs, ids)
end

-- The records of in-flight `ids` in the msgs hash count their delivery, for a REQ that
-- defers them: they stay in the hash.
local function count_delivery(msgs, ids)
  local records, n = {}, 0
  for _, reply in ipairs(call_chunked('HMGET', msgs, ids)) do
    for _, value in ipairs(reply) do
      n = n + 1
      if value then
        records[#records + 1] = ids[n]
        records[#records + 1] = counted(value)
      end
    end
  end
  if #records > 0 then
    call_chunked('HSET', msgs, records)
  end
end
