-- include: time.lua, chunked.lua
-- dedup.lua provides dedup_split(), dedup_known() and dedup_remember(): idempotent
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

-- (whether the set remembers each key unexpired, by position; the window ms), or nil
-- when the part's window is off: then no key is a duplicate.
local function dedup_known(meta, set, keys)
  local window = tonumber(redis.call('HGET', meta, 'dedup_ms') or '0')
  if window <= 0 then return nil, nil end
  local now = now_ms()
  local known = {}
  for from = 1, #keys, CHUNK do
    local to = math.min(from + CHUNK - 1, #keys)
    local expiries = redis.call('ZMSCORE', set, unpack(keys, from, to))
    for i = from, to do
      local expiry = expiries[i - from + 1]
      known[i] = expiry and tonumber(expiry) > now or false
    end
  end
  return known, window
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
