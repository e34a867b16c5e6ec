-- include: chunked.lua
-- queue.lua provides back_to_queue(): messages held in a channel's in-flight or deferred
-- ZSET go to the tail of its queue as their records stand (a delivery's attempt already
-- counted), in the order of `ids`, out of the ZSET, the msgs hash and (for in-flight
-- ones) the leases hash; one command per CHUNK ids. requeue.lua, reap.lua and scan.lua
-- use it. An id whose record is gone is only removed.
local function back_to_queue(queue, zset, msgs, ids, leases)
  local records = {}
  for _, reply in ipairs(call_chunked('HMGET', msgs, ids)) do
    for _, record in ipairs(reply) do
      if record then records[#records + 1] = record end
    end
  end
  call_chunked('RPUSH', queue, records)
  call_chunked('HDEL', msgs, ids)
  if leases then
    call_chunked('HDEL', leases, ids)
  end
  call_chunked('ZREM', zset, ids)
end
