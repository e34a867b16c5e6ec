-- include: finish.lua, deliver.lua
-- deliver: finish the FINs folded in, then deliver_channel() (lib/deliver.lua): pop
-- ready messages of one channel for this broker's clients and put them in flight, in
-- one call for all of them (the group commit folds the FINs of this channel that
-- precede the call into it: one call frees credit and uses it). On an ordered channel
-- the messages the FINs release go out in this call too, and the wake-up of the queue
-- they filled is sent only if some are left in it.
--
-- KEYS[1] queue   KEYS[2] inflight   KEYS[3] msgs   KEYS[4] topic due index
-- KEYS[5] channel meta   KEYS[6] dead-letter outbox   KEYS[7] deferred   KEYS[8] gate
-- KEYS[9] key_of   KEYS[10] waiting   KEYS[11] urgent (lib/queue.lua)
-- KEYS[12] topic version (lib/news.lua)
-- ARGV[1] channel name (its member in the due index)   ARGV[2] max attempts (0: unlimited)
-- ARGV[3] F, then F pairs to finish first: owner, id
-- then groups of 4: owner, timeout ms, count, most bytes (0: any), then 1 if the counts
-- were taken from the channel's rate limit (tokens.lua) else 0, then 1 if lots may be
-- written (data layout 4: lib/inflight.lua) else 0, then last the wake pub/sub channel
-- and the node keys' prefix (node.lua)
-- Returns one list of records per group, in ARGV order, then the channel's count of
-- empties, then the finish codes (finish.lua's), one per pair, then 1 if the queue
-- still has messages, else 0, then 1 if the channel is ordered, else 0, then 1 if it has a
-- rate limit, else 0, then each group's lot name if groups went in flight as lots ('' for
-- a group not in one), else an empty list.
local queue, inflight, msgs, due_index = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local meta, dead, deferred, gate = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local key_of, waiting, urgent, version = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local channel, max_attempts, to_finish = ARGV[1], ARGV[2], tonumber(ARGV[3])
local taken, lots = ARGV[#ARGV - 3] == '1', ARGV[#ARGV - 2] == '1'
local wake, node = ARGV[#ARGV - 1], ARGV[#ARGV]
local FIRST_PAIR = 4
-- the groups' arguments: after the pairs, before the taken and lots flags, the wake
-- channel and the node prefix
local first_group, last_group = FIRST_PAIR + 2 * to_finish, #ARGV - 4

-- the channel's gate (lib/order.lua) with its other keys: the finish's k and
-- deliver_channel's c
local c = order_gate(queue, deferred, msgs, meta, gate, key_of, waiting, urgent, due_index,
                     version, channel, wake, node)
c.inflight, c.dead, c.hold_wake = inflight, dead, true   -- c.meta: order_gate's
local finished = finish_pairs(c, ARGV, FIRST_PAIR, first_group - 1, c)
local out, empties, more, ordered, limited, lot_names = deliver_channel(
    c, max_attempts, ARGV, first_group, last_group, taken, lots)
if c.woken and more == 1 then announce(version, wake, channel, node) end
out[#out + 1] = empties
out[#out + 1] = finished
out[#out + 1] = more
out[#out + 1] = ordered
out[#out + 1] = limited
out[#out + 1] = lot_names
return out
