-- include: finish.lua, deliver.lua
-- deliver: finish the FINs folded in, then deliver_channel() (lib/deliver.lua): pop
-- ready messages of one channel for this broker's clients and put them in flight, in
-- one call for all of them (the group commit folds the FINs of this channel that
-- precede the call into it: one call frees credit and uses it).
--
-- KEYS[1] queue   KEYS[2] inflight   KEYS[3] msgs   KEYS[4] topic due index
-- KEYS[5] channel meta   KEYS[6] dead-letter outbox   KEYS[7] deferred   KEYS[8] gate
-- KEYS[9] key_of   KEYS[10] waiting   KEYS[11] topic version (lib/news.lua)
-- ARGV[1] channel name (its member in the due index)   ARGV[2] max attempts (0: unlimited)
-- ARGV[3] F, then F pairs to finish first: owner, id
-- then groups of 4: owner, timeout ms, count, most bytes (0: any), then last the wake
-- pub/sub channel and the node keys' prefix (node.lua)
-- Returns one list of records per group, in ARGV order, then the channel's count of
-- empties, then the finish codes (finish.lua's), one per pair, then 1 if the queue
-- still has messages, else 0.

local groups = 4 + 2 * tonumber(ARGV[3])
local c = {queue = KEYS[1], inflight = KEYS[2], msgs = KEYS[3], due_index = KEYS[4],
           meta = KEYS[5], dead = KEYS[6], deferred = KEYS[7], gate = KEYS[8],
           key_of = KEYS[9], waiting = KEYS[10], version = KEYS[11],
           channel = ARGV[1], wake = ARGV[#ARGV - 1], node = ARGV[#ARGV]}
local finished = finish_pairs(c, ARGV, 4, groups - 1, c)
local out, empties, more = deliver_channel(c, ARGV[2], ARGV, groups, #ARGV - 2)
out[#out + 1] = empties
out[#out + 1] = finished
out[#out + 1] = more
return out
