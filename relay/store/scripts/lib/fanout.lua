-- fanout.lua provides fanout_begin(), then N_CHANNELS, ARG0, channel_name(),
-- channel_key() and stale_channels(), to the scripts that touch every channel of a
-- topic: the caller names the channels, ARGV[1] = n and ARGV[2..n+1], and declares their
-- keys last in KEYS, 12 per channel in keys.CHANNEL_SUFFIXES order, so that on Redis
-- Cluster every key is checked before the script runs. The caller's list may be
-- stale: stale_channels() then gives the reply that makes it ask again with the
-- topic's real channels. The script's own ARGV start at ARGV[ARG0 + 1]. This file
-- reads KEYS and ARGV itself: the channels' part of them is laid out alike in every
-- script that includes it.
local SUFFIX = {queue = 1, inflight = 2, deferred = 3, msgs = 4, meta = 5, consumers = 6,
                dead = 7, dead_lock = 8, gate = 9, key_of = 10, waiting = 11, urgent = 12}
local PER_CHANNEL = 12
local N_CHANNELS, ARG0, FIRST_CHANNEL_KEY   -- this call's, once fanout_begin() read them

-- This call's channel count, where the script's own ARGV start and where the channels'
-- keys do: every script that includes this file calls it first.
local function fanout_begin()
  N_CHANNELS = tonumber(ARGV[1])
  ARG0 = N_CHANNELS + 1
  FIRST_CHANNEL_KEY = #KEYS - PER_CHANNEL * N_CHANNELS
end

local function channel_name(i)
  return ARGV[1 + i]
end

local function channel_key(i, suffix)
  return KEYS[FIRST_CHANNEL_KEY + PER_CHANNEL * (i - 1) + SUFFIX[suffix]]
end

-- nil if the channels given are those in `set_key`, else {'stale', channels...}
local function stale_channels(set_key)
  local actual = redis.call('SMEMBERS', set_key)
  local given = {}
  for i = 1, N_CHANNELS do given[channel_name(i)] = true end
  local same = #actual == N_CHANNELS
  for _, c in ipairs(actual) do same = same and given[c] end
  if same then return nil end
  return {'stale', unpack(actual)}
end
