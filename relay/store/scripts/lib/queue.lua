-- include: chunked.lua, record.lua
-- queue.lua provides enqueue(), back_to_queue() and count_delivery(), and for the
-- messages of priority 1-9 urgent_list(), urgent_levels(), urgent_count(),
-- urgent_taken() and take_urgent().
--
-- A channel's ready messages (q: {queue =, urgent =, meta =}, its keys) are its queue,
-- a LIST, and for messages of priority 1-9 (data layout 5: the first digit of the id,
-- lib/record.lua) one LIST per priority, `<urgent>:<p>` (named after the declared
-- urgent key, so in its slot), each FIFO as the queue is. The urgent key is a HASH of
-- priority -> how many wait in its list, a field only while some do: a deliver call
-- reads it to know which lists to pop, highest first, and a depth is the queue's
-- length plus its values. Every write to an urgent list counts in it, in the same
-- call. The meta's field `urgent` (set with the first urgent record, never cleared but
-- by an empty) makes deliver calls look at the hash; a channel that never had one pays
-- nothing.
--
-- A record in flight does not count its delivery yet (deliver.lua leaves it as queued;
-- the broker adds it to what it sends), so whatever takes a message out of flight
-- without a FIN writes it in.

local function urgent_list(urgent, p)
  return urgent .. ':' .. p
end

-- The priorities with messages waiting, {priority, count}, highest first.
local function urgent_levels(urgent)
  local got, levels = redis.call('HGETALL', urgent), {}
  for i = 1, #got, 2 do levels[#levels + 1] = {tonumber(got[i]), tonumber(got[i + 1])} end
  table.sort(levels, function(a, b) return a[1] > b[1] end)
  return levels
end

-- How many urgent records wait.
local function urgent_count(urgent)
  local n = 0
  for _, count in ipairs(redis.call('HVALS', urgent)) do n = n + tonumber(count) end
  return n
end

-- n records of priority p left their list: its count goes down (the field, at 0)
local function urgent_taken(urgent, p, n)
  if n > 0 and redis.call('HINCRBY', urgent, p, -n) <= 0 then
    redis.call('HDEL', urgent, p)
  end
end

-- Up to `want` urgent records of channel c, the highest priority first, each from the
-- head of its list. A list found shorter than its count loses the count.
local function take_urgent(c, want)
  local records = {}
  for _, level in ipairs(urgent_levels(c.urgent)) do
    local asked = want - #records
    local got = redis.call('LPOP', urgent_list(c.urgent, level[1]), asked) or {}
    for _, r in ipairs(got) do records[#records + 1] = r end
    if #got < math.min(asked, level[2]) then
      redis.call('HDEL', c.urgent, level[1])
    else
      urgent_taken(c.urgent, level[1], #got)
    end
    if #records >= want then break end
  end
  return records
end

-- enqueue(): records made ready go to the tail of the queue, or of their priority's
-- list (to the head with `front`, the first given ending up last: records popped and
-- given back in reverse). Returns true if the channel had nothing ready before them,
-- as far as one reply shows (a broker waits for the wake-up then).
local function enqueue(q, records, front)
  if #records == 0 then return false end
  local plain, urgent = records, nil      -- urgent: priority -> its records
  for i, r in ipairs(records) do
    if record_priority(r) ~= 0 then
      plain, urgent = {}, {}
      for j = 1, i - 1 do plain[j] = records[j] end
      for j = i, #records do
        local priority = record_priority(records[j])
        if priority == 0 then
          plain[#plain + 1] = records[j]
        else
          urgent[priority] = urgent[priority] or {}
          table.insert(urgent[priority], records[j])
        end
      end
      break
    end
  end
  local fresh = false
  if urgent then
    fresh = redis.call('EXISTS', q.urgent) == 0
    for priority, list in pairs(urgent) do
      call_chunked(front and 'LPUSH' or 'RPUSH', urgent_list(q.urgent, priority), list)
      redis.call('HINCRBY', q.urgent, priority, #list)
    end
    redis.call('HSET', q.meta, 'urgent', 1)
  end
  if #plain > 0 then
    local length = call_chunked(front and 'LPUSH' or 'RPUSH', q.queue, plain)
    fresh = (fresh or not urgent) and length[#length] == #plain
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
