-- drop: empty or delete a channel, or a whole topic (nsqd's Channel.Empty,
-- Channel.Delete, Topic.Empty, Topic.Delete). The keys holding the dropped messages
-- are renamed to trash keys, O(1) each, so this one call is the cut: what the target
-- holds now goes, what is published after it stays. The caller frees the trash, at
-- once (UNLINK) or in short chunks (relay/jobs.py). Emptying keeps the counters;
-- the topic's id counter always stays, so ids are never reused.
--
-- KEYS[1] topic ids   KEYS[2] topic channels   KEYS[3] topic meta   KEYS[4] backlog
-- KEYS[5] backlog deferred   KEYS[6] scanners' due index
-- ARGV[1] trash key prefix   ARGV[2] channel key prefix   ARGV[3] topic name
-- ARGV[4] channel name ('' for the topic)   ARGV[5] 1 to delete, 0 to empty
-- ARGV[6] wake pub/sub channel: a delete announces "!C" (channel C) or "!" (the topic),
-- on which brokers close its consumers, as nsqd does
-- ARGV[7] n, then n suffixes of the message keys, then the channel's other suffixes
-- Returns {the topic's last message id, trash keys...}, or nil when the channel to
-- delete does not exist.
local trash = {}
local function detach(key)
  if redis.call('EXISTS', key) == 1 then
    trash[#trash + 1] = ARGV[1] .. (#trash + 1)
    redis.call('RENAME', key, trash[#trash])
  end
end

local delete, n = ARGV[5] == '1', tonumber(ARGV[7])
local function drop_channel(c)
  local p = ARGV[2] .. c .. ':'
  for i = 8, 7 + n do detach(p .. ARGV[i]) end
  redis.call('ZREM', KEYS[6], ARGV[3] .. '/' .. c)
  if delete then
    for i = 8 + n, #ARGV do redis.call('UNLINK', p .. ARGV[i]) end
  end
end

if ARGV[4] ~= '' then
  if delete and redis.call('SREM', KEYS[2], ARGV[4]) == 0 then
    return nil
  end
  drop_channel(ARGV[4])
else
  detach(KEYS[4])
  detach(KEYS[5])
  if delete then
    for _, c in ipairs(redis.call('SMEMBERS', KEYS[2])) do drop_channel(c) end
    redis.call('UNLINK', KEYS[2], KEYS[3])
  end
end
if delete then
  redis.call('PUBLISH', ARGV[6], '!' .. ARGV[4])
end
return {tonumber(redis.call('GET', KEYS[1]) or '0'), unpack(trash)}
