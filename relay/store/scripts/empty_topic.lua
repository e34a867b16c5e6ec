-- empty_topic: drop what waits in the topic itself (its backlog), as nsqd's
-- Topic.Empty does; channels keep their messages.
--
-- KEYS[1] backlog   KEYS[2] backlog deferred
redis.call('UNLINK', KEYS[1], KEYS[2])
return 1
