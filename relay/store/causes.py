"""Redis' refusals turned into their causes, in a line a user can act on: every Redis
error that reaches a client (error frames, HTTP bodies, relay-admin) or a log line goes
through cause(), so none shows a script's sha or line number.

Redis 7 and Valkey wrap an error inside a function as `<error> script: <function>, on
@user_function:<line>.` (a Lua error starts `user_function:<line>: ` too); redis-py
strips the leading code (OOM, READONLY, LOADING...) of the errors it knows, and keeps
the others' (MISCONF, BUSY). A function refused before it ran (at maxmemory, on a
replica) has no frame."""

import re
import time

import redis

# the frame a function's error comes in, after it, and a Lua error's location, before it
SCRIPT_SUFFIX = re.compile(r",? script: \w+, on @user_function:\d+\.?$")
LUA_LOCATION = re.compile(r"^(?:ERR )?@?user_function:? ?\d+: ")

OUT_OF_MEMORY = "redis is out of memory (maxmemory)"
# what Redis answers an FCALL of a function it does not hold (runner.unloaded)
FUNCTION_NOT_FOUND = "Function not found"
# (what the error says, the cause): the first that matches wins
CAUSES = (
    ("used memory > 'maxmemory'", OUT_OF_MEMORY),
    ("Errors writing to the AOF file: ", "redis cannot write its AOF: {rest}"),
    ("MISCONF", "redis refuses writes: it cannot save its RDB snapshots "
                "(stop-writes-on-bgsave-error)"),
    ("read only replica", "redis is a read-only replica"),
    ("READONLY", "redis is a read-only replica"),
    ("Hash slot not served", "the redis cluster is down (a slot is not served)"),
    ("cluster is down", "the redis cluster is down"),
    ("CLUSTERDOWN", "the redis cluster is down"),
    ("loading the dataset", "redis is loading its data"),
    ("busy running a script", "redis is busy running a script"),
    ("MASTERDOWN", "the redis replica has lost its master"),
    ("Link with MASTER is down", "the redis replica has lost its master"),
)


def cause(error: BaseException) -> str:
    """What `error` means, in one short line: a known refusal's cause, else the error's
    own text without the script's frame (a script's own error reply is kept as it is)."""
    return refusal(error) or unframed(str(error))


def refusal(error: BaseException) -> str | None:
    """The cause of a refusal Redis makes in a state it can leave (out of memory,
    persistence failing, a replica, a cluster down, loading, busy), else None."""
    if str(error).startswith(FUNCTION_NOT_FOUND):
        return "redis has lost relay's functions and they could not be loaded again"
    if isinstance(error, redis.exceptions.OutOfMemoryError):
        return OUT_OF_MEMORY
    text = unframed(str(error))
    if isinstance(error, redis.exceptions.ReadOnlyError):
        text = "READONLY " + text
    elif isinstance(error, redis.exceptions.MasterDownError):
        text = "MASTERDOWN " + text
    elif isinstance(error, redis.exceptions.ClusterDownError):
        text = "CLUSTERDOWN " + text
    for marker, line in CAUSES:
        at = text.find(marker)
        if at >= 0:
            return line.format(rest=text[at + len(marker):].rstrip(". "))
    if isinstance(error, redis.exceptions.BusyLoadingError):
        return "redis is loading its data"
    return None


class Refusals:
    """The last refusal of a publish this process met, until a publish takes again or
    MEMORY seconds pass: at maxmemory the server's state flaps (a refused write frees
    what it had buffered, so the next small one may take), and /ping tells what the
    publishers meet (Store.refusal)."""

    MEMORY = 5.0

    def __init__(self) -> None:
        self.cause: str | None = None
        self.at = float("-inf")

    def met(self, cause: str) -> None:
        self.cause, self.at = cause, time.monotonic()

    def cleared(self) -> None:
        self.cause = None

    def recent(self) -> str | None:
        return self.cause if time.monotonic() - self.at < self.MEMORY else None


REFUSALS = Refusals()


def unframed(text: str) -> str:
    """A script's error without the frame Redis puts it in."""
    text = SCRIPT_SUFFIX.sub("", text.strip())
    return LUA_LOCATION.sub("", text)
