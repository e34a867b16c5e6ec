-- include: chunked.lua, inflight.lua, order.lua
-- finish.lua provides finish_pairs(): FIN of the (owner, id) pairs args[first..last],
-- for any number of owners: one ZMSCORE of their members, then one variadic ZREM and
-- HDEL for all that took. finish.lua runs it alone; deliver.lua first, for the FINs
-- the group commit folds into a deliver call of the same channel.
-- k: {inflight =, msgs =, deferred =} keys; o: the channel's order gate
-- (lib/order.lua's order_gate()), which the messages finished release.
-- Returns per pair: CODE.DONE finished, CODE.NOT_IN_FLIGHT not in flight (or finished
-- earlier in this call), CODE.NOT_OWNER in flight for another client.
local function finish_pairs(k, args, first, last, o)
  local out = {}
  if last < first then
    return out
  end
  local held, codes = holdings(k, args, first, last, 2)
  local done, members, finished = {}, {}, {}
  for n, member in ipairs(held) do
    local id = args[first + 2 * n - 1]
    if member and not finished[id] then
      finished[id] = true
      done[#done + 1] = id
      members[#done] = member
      out[n] = CODE.DONE
    else
      out[n] = member and CODE.NOT_IN_FLIGHT or codes[n]
    end
  end
  if #done > 0 then
    release(k, done, members, false)
    order_release(o, done)
  end
  return out
end
