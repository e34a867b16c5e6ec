-- topic_figures: what /stats and the console show of one topic part, read in one call
-- (relay/store/reads.py read_topic_states): four commands a topic through redis-py's
-- pipeline were most of the reader's time at thousands of topics.
--
-- KEYS[1] topic meta   KEYS[2] backlog   KEYS[3] backlog deferred
-- KEYS[4] (part 0 only) the topic's channels
-- Returns {HGETALL meta (flat), LLEN backlog, ZCARD deferred[, SMEMBERS channels]}.
local out = {redis.call('HGETALL', KEYS[1]), redis.call('LLEN', KEYS[2]),
             redis.call('ZCARD', KEYS[3])}
if KEYS[4] then
  out[4] = redis.call('SMEMBERS', KEYS[4])
end
return out
