-- include: chunked.lua, lease.lua
-- finish.lua provides finish_pairs(): FIN of the (owner, id) pairs args[first..last],
-- for any number of owners: one read of all their leases, then one variadic ZREM and
-- HDELs for all that took. finish.lua runs it alone; deliver.lua first, for the FINs
-- the group commit folds into a deliver call of the same channel.
-- Returns per pair: 1 finished, 0 not in flight (or finished earlier in this call),
-- -1 in flight for another client.
local function finish_pairs(inflight, msgs, leases, args, first, last)
  local out = {}
  local done = {}
  local finished = {}
  if last < first then
    return out
  end
  for n, lease in ipairs(leases_of(leases, args, first + 1, last, 2)) do
    local owner, id = args[first + 2 * n - 2], args[first + 2 * n - 1]
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
    call_chunked('ZREM', inflight, done)
    call_chunked('HDEL', msgs, done)
    call_chunked('HDEL', leases, done)
  end
  return out
end
