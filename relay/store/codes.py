"""The codes the Lua scripts (relay/store/scripts/) answer with, declared once. The loader
(runner.load_scripts) puts them first in every script as the table CODE, so a script
returns CODE.NOT_OWNER where Python compares a reply with codes.NOT_OWNER. A code's value
never changes: brokers of the previous release read the replies of these scripts during
a rolling upgrade."""

# FIN, REQ and TOUCH, per (owner, id) item (lib/inflight.lua); TOUCH answers the new
# deadline where FIN and REQ answer DONE
DONE = 1                # also what a control script answers when it did what it was asked
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


def lua() -> bytes:
    """The codes as the line of Lua every script starts with:
    `local CODE = {DONE = 1, NOT_IN_FLIGHT = 0, ...}`."""
    named = ", ".join(f"{name} = {value}" for name, value in globals().items()
                      if name.isupper() and isinstance(value, int))
    return f"local CODE = {{{named}}}\n".encode()
