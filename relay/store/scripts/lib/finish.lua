-- include: chunked.lua, inflight.lua, order.lua
-- finish.lua provides finish_pairs(): FIN of the (owner, id) pairs args[first..last],
-- for any number of owners: one ZMSCORE of their members, then one variadic ZREM and
-- HDEL for all that took. A pair may name a lot item (lib/inflight.lua) instead of an
-- id: its lot, if still held, gets its flag marked (one ZSCORE, HGET and HSET a lot),
-- else it finishes by its id. finish.lua runs it alone; deliver.lua first, for the FINs
-- the group commit folds into a deliver call of the same channel.
-- k: {inflight =, msgs =, deferred =, meta =} keys; o: the channel's order gate
-- (lib/order.lua's order_gate()), which the messages finished release.
-- Returns per pair: CODE.DONE finished, CODE.NOT_IN_FLIGHT not in flight (or finished
-- earlier in this call), CODE.NOT_OWNER in flight for another client.

-- A lot's FINs: its done string with `items` (their lot items) marked, the count newly
-- marked, and per item CODE.DONE or CODE.NOT_IN_FLIGHT (finished before). A few marks
-- are set one by one, many in one rebuild of the string.
local function marked(done, items, codes)
  local count = 0
  if #items * 8 < #done then
    for n, item in ipairs(items) do
      local i = lot_index(item)
      if string.byte(done, i) == NOT_DONE then
        done = string.sub(done, 1, i - 1) .. '1' .. string.sub(done, i + 1)
        count, codes[n] = count + 1, CODE.DONE
      else
        codes[n] = CODE.NOT_IN_FLIGHT
      end
    end
    return done, count
  end
  local flags = {string.byte(done, 1, -1)}
  for n, item in ipairs(items) do
    local i = lot_index(item)
    if flags[i] == NOT_DONE then
      flags[i], count, codes[n] = DONE, count + 1, CODE.DONE
    else
      codes[n] = CODE.NOT_IN_FLIGHT
    end
  end
  return string.char(unpack(flags)), count
end

-- FIN of the lot items of `lots` (lot -> {owner =, items =, at =}) whose lot its owner
-- holds: marked done, the lot gone once all are; `out` gets their codes. Returns the
-- items of lots not held (turned back into members by a REQ, TOUCH or timeout): those
-- finish by id.
local function finish_lots(k, lots, out)
  local rest, lotted, gone, emptied = {}, 0, {}, {}
  for lot, l in pairs(lots) do
    local member = lot .. ' ' .. l.owner
    if redis.call('ZSCORE', k.inflight, member) then
      local codes = {}
      local done, count = marked(redis.call('HGET', k.msgs, lot .. '+'), l.items, codes)
      for n, at in ipairs(l.at) do out[at] = codes[n] end
      if string.find(done, '0', 1, true) then
        redis.call('HSET', k.msgs, lot .. '+', done)
        lotted = lotted - count
      elseif count > 0 then
        gone[#gone + 1], emptied[#emptied + 1], emptied[#emptied + 2] = member, lot, lot .. '+'
        lotted = lotted - count + 1
      end
    else
      for n, at in ipairs(l.at) do rest[#rest + 1] = {at, l.owner, l.items[n]} end
    end
  end
  if #gone > 0 then
    call_chunked('ZREM', k.inflight, gone)
    call_chunked('HDEL', k.msgs, emptied)
  end
  if lotted ~= 0 then
    redis.call('HINCRBY', k.meta, 'lotted', lotted)
  end
  return rest
end

-- finish_pairs(): FIN of the (owner, id or lot item) pairs args[first..last].
local function finish_pairs(k, args, first, last, o)
  local out = {}
  if last < first then
    return out
  end
  local plain, at, lots, lot_done = {}, {}, {}, {}
  local n = 0
  for i = first, last, 2 do
    n = n + 1
    local x = args[i + 1]
    if #x == LOT_ITEM then
      local lot = string.sub(x, ID_LENGTH + 1, 2 * ID_LENGTH)
      local l = lots[lot]
      if not l then
        l = {owner = args[i], items = {}, at = {}}
        lots[lot] = l
      end
      if l.owner == args[i] then
        l.items[#l.items + 1], l.at[#l.items + 1] = x, n
      else
        plain[#plain + 1], plain[#plain + 2] = args[i], string.sub(x, 1, ID_LENGTH)
        at[#at + 1] = n
      end
    else
      plain[#plain + 1], plain[#plain + 2], at[#at + 1] = args[i], x, n
    end
  end
  if next(lots) then
    for _, item in ipairs(finish_lots(k, lots, out)) do
      plain[#plain + 1], plain[#plain + 2] = item[2], string.sub(item[3], 1, ID_LENGTH)
      at[#at + 1] = item[1]
    end
    if redis.call('EXISTS', o.key_of) == 1 then
      for _, l in pairs(lots) do
        for j, item in ipairs(l.items) do
          if out[l.at[j]] == CODE.DONE then
            lot_done[#lot_done + 1] = string.sub(item, 1, ID_LENGTH)
          end
        end
      end
    end
  end
  local held, codes = holdings(k, plain, 1, #plain, 2)
  local done, members, finished = {}, {}, {}
  for m, member in ipairs(held) do
    local id = plain[2 * m]
    if member and not finished[id] then
      finished[id] = true
      done[#done + 1] = id
      members[#done] = member
      out[at[m]] = CODE.DONE
    else
      out[at[m]] = member and CODE.NOT_IN_FLIGHT or codes[m]
    end
  end
  if #done > 0 then
    release(k, done, members, false)
  end
  for _, id in ipairs(lot_done) do done[#done + 1] = id end
  order_release(o, done)
  return out
end
