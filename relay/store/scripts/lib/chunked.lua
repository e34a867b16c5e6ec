-- chunked.lua provides call_chunked(cmd, key, args, first): cmd on key with the
-- arguments args[first..] (first: 1 if nil) in commands of at most CHUNK arguments
-- each, since Lua's unpack() has a stack limit. CHUNK is even, so field-value and
-- score-member pairs stay whole. Returns the replies, one per command sent.
local CHUNK = 1000
local function call_chunked(cmd, key, args, first)
  local replies = {}
  for i = first or 1, #args, CHUNK do
    replies[#replies + 1] = redis.call(cmd, key, unpack(args, i, math.min(i + CHUNK - 1, #args)))
  end
  return replies
end
