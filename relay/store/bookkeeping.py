"""The processes' own bookkeeping writes (registrations, heartbeats, the reaper's claim,
e2e latency figures), made through bookkeeping.lua so that they go on at Redis' maxmemory, where a plain SET,
HSET or ZADD is refused: a broker or scanner whose heartbeat stopped there would be taken
for dead, and a live broker's in-flight messages reaped."""

from typing import Any

from relay.store.connection import RedisClient
from relay.store.runner import install, load_library, unloaded

LIBRARY = load_library()
FUNCTION = LIBRARY.scripts["bookkeeping"].function


def write(client: RedisClient, *writes: tuple[Any, ...]) -> list:
    """Each write, (command, key, *arguments), in one pipeline: their replies. The library
    is loaded when the server lacks it (restarted without persistence). Raises the first
    error."""
    for _ in range(2):
        pipe = client.pipeline(transaction=False)
        for command, key, *args in writes:
            pipe.execute_command("FCALL", FUNCTION, 1, key, command, *args)
        replies = pipe.execute(raise_on_error=False)
        if not any(unloaded(r) for r in replies):
            break
        install(client, LIBRARY)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
