-- include: finish.lua
-- finish: forget messages their owner finished (FIN), for any number of owners.
--
-- KEYS[1] inflight   KEYS[2] msgs   KEYS[3] leases (the layout before, lib/inflight.lua)
-- KEYS[4] deferred
-- ARGV pairs: owner, id
-- Returns per pair: 1 finished, 0 not in flight (or finished earlier in this call),
-- -1 in flight for another client.
local k = {inflight = KEYS[1], msgs = KEYS[2], leases = KEYS[3], deferred = KEYS[4]}
return finish_pairs(k, ARGV, 1, #ARGV)
