"""The codes the Lua scripts (relay/store/scripts/) answer with, declared once. A script
names one as CODE.NOT_OWNER where Python compares a reply with codes.NOT_OWNER; the
loader (runner.load_scripts) writes its value in its place (inline), so a call pays
nothing for the names (a table of them made per call cost Redis 1 µs) and a name not
declared here stops the loading. A code's value never changes: brokers of the previous
release read the replies of these scripts during a rolling upgrade."""

import re

# FIN, REQ and TOUCH, per (owner, id) item (lib/inflight.lua); TOUCH answers the new
# deadline where FIN and REQ answer DONE
DONE = 1                # also what a control script answers when it did what it was asked
MORE = 2                # a control script did a step of what it was asked: call it again
NOT_IN_FLIGHT = 0       # not in flight, or settled earlier in the same call
NOT_OWNER = -1          # in flight for another client

# relay-admin limit, order and ttl on one part (limit.lua, ordered.lua, ttl.lua)
NO_CHANNEL = 0          # the part has no such channel
ORDERED = -1            # limit.lua: the channel is ordered, so it takes no depth limit
LIMITED = -1            # ordered.lua: the channel has a depth limit, so it is not ordered

# redrive.lua answers how many it queued, so its "no such channel" is below any count
REDRIVE_NO_CHANNEL = -1

# a consumer leaving a channel (lib/leave.lua: unsubscribe.lua, reap.lua)
KEPT = 0                # the channel stays
CHANNEL_DELETED = 1     # the ephemeral channel was deleted
TOPIC_DELETED = 2       # and its ephemeral topic with it

# a time (ms) a reply has none of: nothing due (scan.lua), nothing retained (trim.lua)
NO_TIME = -1


def inline(source: bytes) -> bytes:
    """`source` with each CODE.NAME as its value (a negative one in parentheses, so
    `a-CODE.NOT_OWNER` stays a subtraction); KeyError for a name not declared."""
    def value(named: re.Match) -> bytes:
        code = CODES[named.group(1).decode()]
        return str(code).encode() if code >= 0 else f"({code})".encode()
    return re.sub(rb"\bCODE\.(\w+)", value, source)


CODES = {name: value for name, value in dict(globals()).items()
         if name.isupper() and isinstance(value, int)}
