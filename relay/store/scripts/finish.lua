-- include: chunked.lua, lease.lua
-- finish: forget messages their owner finished (FIN), for any number of owners: one
-- read of all their leases, then one variadic ZREM and HDELs for all that took.
--
-- KEYS[1] inflight   KEYS[2] msgs   KEYS[3] leases
-- ARGV pairs: owner, id
-- Returns per pair: 1 finished, 0 not in flight (or finished earlier in this call),
-- -1 in flight for another client.
local out = {}
local done = {}
local finished = {}
local leases = leases_of(KEYS[3], ARGV, 2, 2)
for n, lease in ipairs(leases) do
  local owner, id = ARGV[2 * n - 1], ARGV[2 * n]
  local delivered, refused = lease_of(lease, owner)
  if not delivered or finished[id] then
    out[n] = refused or 0
  else
    finished[id] = true
    done[#done + 1] = id
    out[n] = 1
  end
end
if #done > 0 then
  call_chunked('ZREM', KEYS[1], done)
  call_chunked('HDEL', KEYS[2], done)
  call_chunked('HDEL', KEYS[3], done)
end
return out
