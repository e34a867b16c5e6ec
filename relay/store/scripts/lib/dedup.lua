-- include: time.lua, chunked.lua
-- dedup.lua provides dedup_split(), dedup_fresh() and dedup_remember(): idempotent
-- publish. A part whose meta has `dedup_ms` remembers each publish key for that long
-- in its dedup set (keys.py: relay:{T}:dedup, key -> expiry ms); a key it remembers is
-- not published again. The check and the publish are one script call, so two brokers
-- racing on one key publish it once.
local DEDUP_SWEEP = 100   -- expired keys removed per call beyond the call's own count

-- The keys of a string of keys joined by spaces, in order (keys have no spaces:
-- relay/store/dedup.py).
local function dedup_split(joined)
  local keys = {}
  for key in string.gmatch(joined, '[^ ]+') do keys[#keys + 1] = key end
  return keys
end

-- (the positions of the messages to publish, the number of duplicates, the window ms
-- or nil when off): keys[i] is message i's; a key the set remembers unexpired, or an
-- earlier message of the same call has, is a duplicate.
local function dedup_fresh(meta, set, keys)
  local window = tonumber(redis.call('HGET', meta, 'dedup_ms') or '0')
  local fresh = {}
  if window <= 0 then
    for i = 1, #keys do fresh[i] = i end
    return fresh, 0, nil
  end
  local now = now_ms()
  local seen = {}
  for from = 1, #keys, CHUNK do
    local to = math.min(from + CHUNK - 1, #keys)
    local expiries = redis.call('ZMSCORE', set, unpack(keys, from, to))
    for i = from, to do
      local expiry = expiries[i - from + 1]
      if not seen[keys[i]] and not (expiry and tonumber(expiry) > now) then
        fresh[#fresh + 1] = i
      end
      seen[keys[i]] = true
    end
  end
  return fresh, #keys - #fresh, window
end

-- Remember the keys at `positions` for `window` ms, and drop a bounded number of
-- expired ones; the set itself expires a window after this, so an idle topic's goes.
local function dedup_remember(set, window, keys, positions)
  local now = now_ms()
  local expiry = string.format('%d', now + window)   -- one string, not one per key
  local scored = {}
  for _, i in ipairs(positions) do
    scored[#scored + 1] = expiry
    scored[#scored + 1] = keys[i]
  end
  call_chunked('ZADD', set, scored)
  local expired = redis.call('ZCOUNT', set, '-inf', now)
  if expired > 0 then
    redis.call('ZREMRANGEBYRANK', set, 0, math.min(expired, #positions + DEDUP_SWEEP) - 1)
  end
  redis.call('PEXPIRE', set, window)
end
