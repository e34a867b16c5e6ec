-- include: finish.lua
-- finish: forget messages their owner finished (FIN), for any number of owners; on an
-- ordered channel their keys' next messages go out (lib/order.lua).
--
-- KEYS[1] inflight   KEYS[2] msgs   KEYS[3] deferred   KEYS[4] queue   KEYS[5] gate
-- KEYS[6] key_of   KEYS[7] waiting   KEYS[8] topic due index
-- KEYS[9] topic version (lib/news.lua)
-- ARGV[1] channel name   ARGV[2] wake pub/sub channel   ARGV[3] the node keys' prefix
-- (lib/node.lua), then pairs: owner, id
-- Returns per pair: 1 finished, 0 not in flight (or finished earlier in this call),
-- -1 in flight for another client.
local k = {inflight = KEYS[1], msgs = KEYS[2], deferred = KEYS[3]}
local o = {queue = KEYS[4], gate = KEYS[5], key_of = KEYS[6], waiting = KEYS[7],
           msgs = KEYS[2], deferred = KEYS[3], due_index = KEYS[8], version = KEYS[9],
           channel = ARGV[1], wake = ARGV[2], node = ARGV[3]}
return finish_pairs(k, ARGV, 4, #ARGV, o)
