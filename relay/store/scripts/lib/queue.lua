-- include: chunked.lua, record.lua
-- queue.lua provides back_to_queue() and count_delivery(). A record in flight does not
-- count its delivery yet (deliver.lua leaves it as queued; the broker adds it to what
-- it sends), so whatever takes a message out of flight without a FIN writes it in.
--
-- back_to_queue(): messages whose records are in a channel's msgs hash (in flight or
-- deferred) go to the tail of its queue, in the order of `ids`, out of the msgs hash;
-- one command per CHUNK ids. With `in_flight` they come out of flight, so each record
-- counts its delivery first; without, they were deferred. The caller takes them out of
-- their ZSET (release() for in-flight ones). requeue.lua, reap.lua and scan.lua use it.
-- An id whose record is gone is only removed.
local function counted(record)
  return with_attempts(record, math.min(record_attempts(record) + 1, 65535))
end

local function back_to_queue(queue, msgs, ids, in_flight)
  local records = {}
  for _, reply in ipairs(call_chunked('HMGET', msgs, ids)) do
    for _, value in ipairs(reply) do
      if value then
        records[#records + 1] = in_flight and counted(value) or value
      end
    end
  end
  call_chunked('RPUSH', queue, records)
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
