-- maxmemory.lua provides past_maxmemory(), which a script that must run at Redis'
-- maxmemory under noeviction calls before its first write: the scripts that free memory
-- or only move data (subscribe, unsubscribe, requeue, touch, scan; versions and seed,
-- which brokers and scanners run every second; bookkeeping, the processes'
-- registrations). At maxmemory Redis refuses the commands that may grow memory (its
-- `denyoom` ones: SADD, HSET, ZADD, RPUSH, INCRBY...), but inside a script only while
-- the script has written nothing yet: Redis 6.2 checks `lua_write_dirty`
-- (scripting.c, luaRedisGenericCommand), Redis 7 and Valkey 8 `SCRIPT_WRITE_DIRTY` for
-- a script without flags (script.c, scriptVerifyOOM), and any command with the write
-- flag sets it, whatever it changes. So this deletes a key that never exists, in the
-- slot of `key`, the script's first key (on a cluster, a key of its own node): it changes
-- nothing, so nothing reaches the AOF or the replicas, and the script's writes then run.
-- It is a pcall: while its slot migrates, a key that does not exist is "not local" to a
-- cluster node, an error that comes after the flag is set (in 6.2 as in Valkey 8).
-- (Redis 7's `#!lua flags=allow-oom` says the same, but Redis 6.2 cannot parse it.)
-- deliver.lua, finish.lua, drop.lua and reap.lua need not call it: their first write is
-- always one that Redis lets through (LPOP, ZREM, RENAME, HDEL, SREM).
-- The publishing scripts (publish, publish_commit, redrive) must not call it: refused at
-- their first write, before any other, they are the back-pressure, and an MPUB stays all
-- or nothing. publish_step calls it: a staged MPUB committed must be published whole.
local function past_maxmemory(key)
  local tag = string.match(key, '{(.-)}')
  if not tag or tag == '' then tag = key end
  redis.pcall('DEL', '{' .. tag .. '}:nothing')
end
