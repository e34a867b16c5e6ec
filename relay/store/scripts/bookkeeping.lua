-- bookkeeping: one write of the processes' own bookkeeping outside the queue state, which
-- must go on at maxmemory (runner.REFUSED_AT_MAXMEMORY): a broker's registration and its
-- clients, a scanner's heartbeat, the reaper's claim, the FINs' e2e latency figures
-- (relay/store/bookkeeping.py). Each is small, and bounded by the number of processes or
-- channels.
--
-- KEYS[1] the key   ARGV[1] the command   ARGV[2..] its arguments after the key
-- Returns the command's reply.
local key, command = KEYS[1], ARGV[1]
local FIRST_ARG = 2
return redis.call(command, key, unpack(ARGV, FIRST_ARG))
