-- decimal.lua provides decimal(n): a record length's text, made once for the library.
-- Lua 5.1 makes a number's text with sprintf (0.3-0.6 µs each in Redis), and a lot
-- or a history entry writes one length per record, mostly the same few (BENCHMARKS.md).
-- Lengths below DECIMAL_CACHED are kept: at most that many short strings.
local DECIMAL_CACHED = 8192
local DECIMALS = {}

local function decimal(n)
  local text = DECIMALS[n]
  if not text then
    text = tostring(n)
    if n < DECIMAL_CACHED then DECIMALS[n] = text end
  end
  return text
end
