-- include: chunked.lua
-- queue.lua provides back_to_queue(): messages whose records are in a channel's msgs
-- hash (in flight or deferred) go to the tail of its queue as their records stand (a
-- delivery's attempt already counted), in the order of `ids`, out of the msgs hash; one
-- command per CHUNK ids. The caller takes them out of their ZSET (release() for
-- in-flight ones). requeue.lua, reap.lua and scan.lua use it. An id whose record is
-- gone is only removed.
local function back_to_queue(queue, msgs, ids)
  local records = {}
  for _, reply in ipairs(call_chunked('HMGET', msgs, ids)) do
    for _, value in ipairs(reply) do
      if value then records[#records + 1] = value end
    end
  end
  call_chunked('RPUSH', queue, records)
  call_chunked('HDEL', msgs, ids)
end
