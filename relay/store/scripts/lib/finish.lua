-- include: chunked.lua, inflight.lua, order.lua
-- finish.lua provides finish_pairs(): FIN of the (owner, x) pairs args[first..last], for
-- any number of owners, where x is an id, or a run of messages of one lot (lot_run:
-- relay/store/inflight.py's fin_args, one pair for what took two per message): the
-- lot's name, each message's index in 2 characters, then their ids. Ids: one ZMSCORE of
-- their members, then one variadic ZREM and HDEL for all that took. A lot still held
-- gets its messages' flags marked (one ZSCORE, HGET and HSET a lot), else each message
-- finishes by its id. finish.lua runs it alone; deliver.lua first, for the FINs the
-- group commit folds into a deliver call of the same channel.
-- k: {inflight =, msgs =, deferred =, meta =} keys; o: the channel's order gate
-- (lib/order.lua's order_gate()), which the messages finished release.
-- Returns per message, in order: CODE.DONE finished, CODE.NOT_IN_FLIGHT not in flight
-- (or finished earlier in this call), CODE.NOT_OWNER in flight for another client.

-- The messages of a lot run x: their count, and the position of their ids in x.
local function run_size(x)
  local count = (#x - ID_LENGTH) / LOT_RUN_ITEM
  return count, ID_LENGTH + 2 * count + 1
end

-- The id of message j (from 1) of a lot run whose ids start at `ids`.
local function run_id(x, ids, j)
  local at = ids + (j - 1) * ID_LENGTH
  return string.sub(x, at, at + ID_LENGTH - 1)
end

-- FIN of the runs of one lot (l: {owner =, runs =, at = each run's first position}) in
-- its done string: `out` gets each message's code. Returns the done string and the
-- count newly marked. A run's indexes are read STRING_BYTES at a time (Lua's stack); a
-- few marks are set one by one, many in one rebuild of the string (a lot may hold
-- thousands, and a FIN call one of them).
local STRING_BYTES = 4000
local function marked(done, l, out)
  local indexes, at, k = {}, {}, 0
  for r, x in ipairs(l.runs) do
    local p, stop = l.at[r], ID_LENGTH + 2 * run_size(x)
    for from = ID_LENGTH + 1, stop, STRING_BYTES do
      local b = {string.byte(x, from, math.min(from + STRING_BYTES - 1, stop))}
      for j = 1, #b, 2 do
        k = k + 1
        indexes[k], at[k], p = (b[j] - 48) * 64 + b[j + 1] - 47, p, p + 1
      end
    end
  end
  local count = 0
  if k * 8 < #done then
    for n, i in ipairs(indexes) do
      if string.byte(done, i) == NOT_DONE then
        done = string.sub(done, 1, i - 1) .. '1' .. string.sub(done, i + 1)
        count, out[at[n]] = count + 1, CODE.DONE
      else
        out[at[n]] = CODE.NOT_IN_FLIGHT
      end
    end
    return done, count
  end
  local flags = {string.byte(done, 1, -1)}
  for n, i in ipairs(indexes) do
    if flags[i] == NOT_DONE then
      flags[i], count, out[at[n]] = DONE, count + 1, CODE.DONE
    else
      out[at[n]] = CODE.NOT_IN_FLIGHT
    end
  end
  return string.char(unpack(flags)), count
end

-- FIN of the runs of `lots` (lot -> {owner =, runs =, at =}) whose lot its owner holds:
-- marked done, the lot gone once all are; `out` gets their codes. Returns the lots not
-- held (turned back into members by a REQ, TOUCH or timeout): those finish by id.
local function finish_lots(k, lots, out)
  local rest, lotted, gone, emptied = {}, 0, {}, {}
  for lot, l in pairs(lots) do
    local member = lot .. ' ' .. l.owner
    if redis.call('ZSCORE', k.inflight, member) then
      local done, count = marked(redis.call('HGET', k.msgs, lot .. '+'), l, out)
      if string.find(done, '0', 1, true) then
        redis.call('HSET', k.msgs, lot .. '+', done)
        lotted = lotted - count
      elseif count > 0 then
        gone[#gone + 1], emptied[#emptied + 1], emptied[#emptied + 2] = member, lot, lot .. '+'
        lotted = lotted - count + 1
      end
    else
      rest[#rest + 1] = l
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

-- Each message of lot runs `l` as a pair (owner, id) of `plain`, its position in `at`.
local function by_id(l, plain, at)
  for r, x in ipairs(l.runs) do
    local count, ids = run_size(x)
    for j = 1, count do
      plain[#plain + 1], plain[#plain + 2] = l.owner, run_id(x, ids, j)
      at[#at + 1] = l.at[r] + j - 1
    end
  end
end

-- finish_pairs(): FIN of the (owner, id or lot run) pairs args[first..last].
local function finish_pairs(k, args, first, last, o)
  local out = {}
  if last < first then
    return out
  end
  local plain, at, lots, lot_done = {}, {}, {}, {}
  local n = 0
  for i = first, last, 2 do
    local x = args[i + 1]
    if #x > ID_LENGTH then
      local lot = string.sub(x, 1, ID_LENGTH)
      local l = lots[lot]
      if not l then
        l = {owner = args[i], runs = {}, at = {}}
        lots[lot] = l
      end
      if l.owner == args[i] then
        local r = #l.runs + 1
        l.runs[r], l.at[r] = x, n + 1
      else
        by_id({owner = args[i], runs = {x}, at = {n + 1}}, plain, at)
      end
      n = n + run_size(x)
    else
      n = n + 1
      plain[#plain + 1], plain[#plain + 2], at[#at + 1] = args[i], x, n
    end
  end
  if next(lots) then
    for _, l in ipairs(finish_lots(k, lots, out)) do
      by_id(l, plain, at)
    end
    if redis.call('EXISTS', o.key_of) == 1 then
      for _, l in pairs(lots) do
        for r, x in ipairs(l.runs) do
          local count, ids = run_size(x)
          for j = 1, count do
            if out[l.at[r] + j - 1] == CODE.DONE then
              lot_done[#lot_done + 1] = run_id(x, ids, j)
            end
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
