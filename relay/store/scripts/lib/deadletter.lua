-- deadletter.lua provides dead_entry(): an entry of a channel's dead-letter outbox
-- (KEYS dead) is either a record as deliver.lua puts it there (reason max_attempts) or
-- `<reason>:<record>` with an ASCII reason (expired, overflow). A record's first byte
-- has its top bit set (record.lua), so the first byte tells them apart
-- (relay/store/deadletter.py, split_entry).
local function dead_entry(reason, record)
  return reason .. ':' .. record
end
