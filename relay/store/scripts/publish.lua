-- include: append.lua, dedup.lua
-- publish: append messages to every channel of a topic, now or deferred.
-- With no channel yet, they wait in the topic backlog for the first one
-- (nsqd keeps them in the topic queue the same way). With the topic's retention on
-- (its meta's settings, lib/history.lua), the history keeps a copy of each, in this
-- same call (an entry per call, or per ENTRY_BYTES of it), and is trimmed by a bounded
-- step (lib/append.lua).
--
-- KEYS[1] topic ids (STRING)   KEYS[2] topic meta   KEYS[3] topic channels
-- KEYS[4] backlog (LIST)       KEYS[5] backlog deferred (ZSET record -> due)
-- KEYS[6] topic due index (scanners)   KEYS[7] topic version (news.lua)
-- KEYS[8] topic history (STREAM)
-- KEYS[9] with publish keys the dedup set (ZSET, lib/dedup.lua), only when ARGV says
-- so; then the channels' keys (fanout.lua)
-- ARGV[1..ARG0] the channels (fanout.lua), then: wake pub/sub channel,
-- 8-byte timestamp, defer ms (0 = now), the part's number (keys.py), the node keys'
-- prefix (lib/node.lua), the number of publish keys (0: none), bodies...,
-- then with keys one more: a key per body, joined by spaces (one argument costs less
-- to send than one per key; keys have no spaces). With keys, it returns {the count of
-- the last message or 0 if none was published, the number of duplicates}: a key the
-- part's dedup window remembers is not published again (lib/dedup.lua).
-- A call's arguments are bounded (runner.MAX_CALL_ARGS): a bigger MPUB is staged and
-- published by publish_commit.lua and publish_step.lua instead.
-- Its first write is INCRBY: at maxmemory Redis refuses it before anything is written
-- (lib/maxmemory.lua).
-- With a channel's depth limit (lib/limit.lua; only read when the topic meta counts
-- one) a publish to the queues is refused before that write when a `reject` channel
-- has no room for all of it, and each `drop-oldest` or `dead-letter` channel's oldest
-- go after it.
-- Ids are the part's number in 4 hex digits, then the topic's count in 12.
-- Returns the count of the last message (ids are consecutive), or the stale reply.
local stale = stale_channels(KEYS[3])
if stale then return stale end
local wake, timestamp = ARGV[ARG0 + 1], ARGV[ARG0 + 2]
local defer = tonumber(ARGV[ARG0 + 3])
local part = tonumber(ARGV[ARG0 + 4])
local NODE = ARGV[ARG0 + 5]
local keyed = tonumber(ARGV[ARG0 + 6])
local FIRST_BODY = ARG0 + 7
local n = #ARGV - FIRST_BODY + 1 - math.min(keyed, 1)
local fresh, duplicates, window = nil, 0, nil   -- positions to publish, with keys
local publish_keys = nil
if keyed > 0 then
  publish_keys = dedup_split(ARGV[#ARGV])
  fresh, duplicates, window = dedup_fresh(KEYS[2], KEYS[9], publish_keys)
  n = #fresh
  if n == 0 then return {0, duplicates} end
end
local due = nil
if defer > 0 then due = now_ms() + defer end
local p = publishing(due)
if p.limits then
  local full = full_channel(p.limits, n, part_of(KEYS[2]))
  if full then return redis.error_reply(full) end
end
local last = redis.call('INCRBY', KEYS[1], n)
local first = last - n + 1
if window then dedup_remember(KEYS[9], window, publish_keys, fresh) end
local bodies = {}
for i = 1, n do bodies[i] = ARGV[FIRST_BODY + (fresh and fresh[i] or i) - 1] end
local bytes = append(p, first, bodies, timestamp, part)
appended(p, n, bytes, wake, NODE)
if keyed > 0 then return {last, duplicates} end
return last
