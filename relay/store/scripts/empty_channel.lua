-- empty_channel: drop every message of a channel, ready, in flight and deferred, as
-- nsqd's Channel.Empty does; counters stay. UNLINK frees big values off the main thread.
--
-- KEYS[1] queue   KEYS[2] inflight   KEYS[3] deferred   KEYS[4] msgs   KEYS[5] leases
-- KEYS[6] scanners' due index
-- ARGV[1] due member
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('ZREM', KEYS[6], ARGV[1])
return 1
