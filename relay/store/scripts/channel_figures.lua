-- channel_figures: what /stats and the console show of channels of one part, read in
-- one call (relay/store/reads.py read_channels). Read as 7 commands per channel
-- through redis-py's pipeline, 10,000 channels cost the reader 1.5 s of Python.
--
-- KEYS, 7 per channel: its queue, waiting, gate, inflight, deferred, meta, consumers
-- Returns per channel {LLEN queue, ZCARD waiting, HLEN gate, ZCARD inflight,
-- ZCARD deferred, HGETALL meta (flat), HVALS consumers}.
local out = {}
for i = 1, #KEYS, 7 do
  out[#out + 1] = {redis.call('LLEN', KEYS[i]), redis.call('ZCARD', KEYS[i + 1]),
                   redis.call('HLEN', KEYS[i + 2]), redis.call('ZCARD', KEYS[i + 3]),
                   redis.call('ZCARD', KEYS[i + 4]), redis.call('HGETALL', KEYS[i + 5]),
                   redis.call('HVALS', KEYS[i + 6])}
end
return out
