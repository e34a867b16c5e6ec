-- include: chunked.lua
-- stage: append one piece of a big MPUB's bodies to its stage (a LIST), before the
-- publish_commit call that publishes them all or none. A stage is sent a piece a call,
-- each call in its own pipeline of the broker's group commit, so the other
-- connections' calls go between them: one pipeline of the whole stage held them up for
-- as long as Redis took to read it (0.5 s for 5 MB of HTTP /mpub).
-- KEYS[1] the stage
-- ARGV[1] its time to live (ms): it goes by itself if the commit never comes (the
-- broker died in between); ARGV[2] 1 for the first piece: the stage is emptied first,
-- so a publish sent again stages its bodies once; ARGV[3..] the bodies.
-- At maxmemory Redis refuses the call, as publish's (runner.REFUSED_AT_MAXMEMORY).
-- Returns the stage's length.
local stage = KEYS[1]
local ttl, first_piece = ARGV[1], ARGV[2] == '1'
local FIRST_BODY = 3

if first_piece then redis.call('DEL', stage) end
call_chunked('RPUSH', stage, ARGV, FIRST_BODY)
redis.call('PEXPIRE', stage, ttl)
return redis.call('LLEN', stage)
