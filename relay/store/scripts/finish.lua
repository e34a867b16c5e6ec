-- include: finish.lua
-- finish: forget messages their owner finished (FIN), for any number of owners; on an
-- ordered channel their keys' next messages go out (lib/order.lua).
--
-- KEYS[1] inflight   KEYS[2] msgs   KEYS[3] deferred   KEYS[4] queue   KEYS[5] gate
-- KEYS[6] key_of   KEYS[7] waiting   KEYS[8] channel meta   KEYS[9] urgent (lib/queue.lua)
-- KEYS[10] topic due index   KEYS[11] topic version (lib/news.lua)
-- ARGV[1] channel name   ARGV[2] wake pub/sub channel   ARGV[3] the node keys' prefix
-- (lib/node.lua), then pairs: owner, id
-- Returns per pair: CODE.DONE finished, CODE.NOT_IN_FLIGHT not in flight (or finished
-- earlier in this call), CODE.NOT_OWNER in flight for another client.
local inflight, msgs, deferred, queue, gate = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local key_of, waiting, meta, urgent = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local due_index, version = KEYS[10], KEYS[11]
local channel, wake, node = ARGV[1], ARGV[2], ARGV[3]
local FIRST_PAIR = 4

local k = {inflight = inflight, msgs = msgs, deferred = deferred, meta = meta}
local o = order_gate(queue, deferred, msgs, meta, gate, key_of, waiting, urgent, due_index,
                     version, channel, wake, node)
return finish_pairs(k, ARGV, FIRST_PAIR, #ARGV, o)
