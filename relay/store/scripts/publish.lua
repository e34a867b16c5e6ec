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
-- prefix (lib/node.lua), the number of publish keys (0: none), the groups ('' for one),
-- the order keys ('' for none; else one per body joined by newlines, an empty one for a
-- body without: lib/order.lua), the priorities ('' for all 0; else a digit 0-9 per
-- body: lib/append.lua), bodies..., then with keys one more: a key per body, joined by spaces (one argument
-- costs less to send than one per key; keys have no spaces). A key the part's dedup
-- window remembers, or an earlier message of the call has, is not published again
-- (lib/dedup.lua).
-- Groups: the publishes of several clients merged into this one call (the broker's
-- group commit), as their message counts joined by spaces. Each group is published or
-- refused as its own call would be, in order. With keys or a depth limit to apply, it
-- returns per group two values: the count of its last message (0 if it published none)
-- and its duplicates, or 0 and why it was refused; else (every group published whole)
-- the count of the last message, from which each group's follows.
-- Without groups it returns, with keys, {the count of the last message or 0, the number
-- of duplicates}, else the count of the last message; a refusal is an error reply.
-- A call's arguments are bounded (runner.MAX_CALL_ARGS): a bigger MPUB is staged and
-- published by publish_commit.lua and publish_step.lua instead.
-- At maxmemory Redis refuses the call before anything is written (its function is not
-- allow-oom: runner.REFUSED_AT_MAXMEMORY).
-- With a channel's depth limit (lib/limit.lua; only read when the topic meta counts
-- one) a group's publish to the queues is refused before that write when a `reject`
-- channel has no room for all of it (after the groups before it), and each `drop-oldest`
-- or `dead-letter` channel's oldest go after it.
-- Ids are the part's number in 4 hex digits, then the topic's count in 12.
-- The stale reply (fanout.lua) comes before anything is done.
-- KEYS[2..8] are lib/append.lua's too, which reads them itself.
fanout_begin()
local topic_ids, topic_meta, channels = KEYS[1], KEYS[2], KEYS[3]
local dedup_set = KEYS[9]     -- with publish keys only
local wake, timestamp = ARGV[ARG0 + 1], ARGV[ARG0 + 2]
local defer = tonumber(ARGV[ARG0 + 3])
local part = tonumber(ARGV[ARG0 + 4])
local node = ARGV[ARG0 + 5]
local keyed = tonumber(ARGV[ARG0 + 6])
local group_sizes = ARGV[ARG0 + 7]
local ordered = ARGV[ARG0 + 8]
local prioritized = ARGV[ARG0 + 9]
local FIRST_BODY = ARG0 + 10
local joined_keys = ARGV[#ARGV]     -- with publish keys only

local stale = stale_channels(channels)
if stale then return stale end
local grouped = group_sizes ~= ''
local n = #ARGV - FIRST_BODY + 1 - math.min(keyed, 1)
local publish_keys, known, window = nil, nil, nil
if keyed > 0 then
  publish_keys = dedup_split(joined_keys)
  known, window = dedup_known(topic_meta, dedup_set, publish_keys)
end
local due = nil
if defer > 0 then due = now_ms() + defer end
local p = publishing(due)

-- The order key of each body (false for none), from their joined form.
local function order_split(joined)
  local out = {}
  for key in string.gmatch(joined .. '\n', '([^\n]*)\n') do out[#out + 1] = key ~= '' and key end
  return out
end

-- Per group (sizes), what to publish, and its answer: {its last message's place among
-- those published or 0, its duplicates}, or {0, why refused}. Returns the places of the
-- messages to publish, in order.
local function admit(sizes, answers)
  local fresh, seen, from, count = {}, {}, 0, 0
  for g, size in ipairs(sizes) do
    size = tonumber(size)
    local mine, taken = {}, {}
    for i = from + 1, from + size do
      local key = known and publish_keys[i]
      if not key or not (known[i] or seen[key] or taken[key]) then
        mine[#mine + 1] = i
        if key then taken[key] = true end
      end
    end
    local full = p.limits and #mine > 0 and
        full_channel(p.limits, count + #mine, part_of(topic_meta))
    if full then
      answers[g] = {0, full}
    else
      for _, i in ipairs(mine) do fresh[#fresh + 1] = i end
      for key in pairs(taken) do seen[key] = true end
      count = count + #mine
      answers[g] = {#mine > 0 and count or 0, size - #mine}
    end
    from = from + size
  end
  return fresh
end

local fresh, answers = nil, nil
if known or p.limits then
  answers = {}
  fresh = admit(grouped and dedup_split(group_sizes) or {n}, answers)
  n = #fresh
end
local last = 0
if n > 0 then
  last = redis.call('INCRBY', topic_ids, n)
  if window then dedup_remember(dedup_set, window, publish_keys, fresh) end
  local bodies, order_keys, given, priorities = {}, nil, nil, nil
  if ordered ~= '' and p.ordered then
    order_keys, given = {}, order_split(ordered)
  end
  if prioritized ~= '' then priorities = {} end
  for i = 1, n do
    local at = fresh and fresh[i] or i
    bodies[i] = ARGV[FIRST_BODY + at - 1]
    if order_keys then order_keys[i] = given[at] end
    if priorities then priorities[i] = string.byte(prioritized, at) - 48 end
  end
  local bytes = append(p, last - n + 1, bodies, timestamp, part, order_keys, priorities)
  appended(p, n, bytes, wake, node)
end
if not answers then
  if keyed > 0 and not grouped then return {last, 0} end
  return last
end
local out = {}
for g, answer in ipairs(answers) do
  if type(answer[2]) == 'number' and answer[1] > 0 then answer[1] = last - n + answer[1] end
  out[2 * g - 1], out[2 * g] = answer[1], answer[2]
end
if grouped then return out end
if answers[1][1] == 0 and type(answers[1][2]) == 'string' then
  return redis.error_reply(answers[1][2])
end
if keyed > 0 then return {answers[1][1], answers[1][2]} end
return last
