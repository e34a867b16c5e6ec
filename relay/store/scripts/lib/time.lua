-- time.lua provides now_ms(): Redis' clock (TIME) in milliseconds, the clock of every
-- deadline, due time and lease (Store.now_ms reads the same).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
