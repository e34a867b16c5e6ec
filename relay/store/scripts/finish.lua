-- include: finish.lua
-- finish: forget messages their owner finished (FIN), for any number of owners.
--
-- KEYS[1] inflight   KEYS[2] msgs   KEYS[3] leases
-- ARGV pairs: owner, id
-- Returns per pair: 1 finished, 0 not in flight (or finished earlier in this call),
-- -1 in flight for another client.
return finish_pairs(KEYS[1], KEYS[2], KEYS[3], ARGV, 1, #ARGV)
