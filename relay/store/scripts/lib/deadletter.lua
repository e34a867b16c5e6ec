-- deadletter.lua provides dead_entry(): an entry of a channel's dead-letter outbox
-- (keys.py: relay:{T}:ch:C:dead) that says why the message is dead. An entry is either
-- a plain record (reason max_attempts) or "<reason>:<record>" with an ASCII reason
-- (expired, overflow): a record starts with a byte of 128 or more, so the first byte
-- tells them apart (relay/store/deadletter.py's split_entry reads them).
local function dead_entry(reason, record)
  return reason .. ':' .. record
end
