"""Deadlines of what a broker's greenlets wait on, kept by one greenlet.

A gevent Timeout per wait (a libev timer started and stopped, an exception object made)
cost the broker more than many waits themselves: a socket ping-pong between two
greenlets took about 2x as long with the reading socket's timeout set. A client's
command and its answer from Redis are each such a wait, so both keep their deadlines
here instead: one greenlet looks at what is waiting every TICK, and expires what is due.
"""

import time
from typing import Protocol

import gevent


class Expiring(Protocol):
    """A wait that may pass its deadline: `expires` (monotonic seconds), and `expire()`,
    which ends the wait with its error and must not switch greenlets."""

    @property
    def expires(self) -> float: ...

    def expire(self) -> None: ...


class Deadlines:
    """What is watched is expired up to TICK after its deadline. The keeping greenlet ends
    once nothing has been watched for IDLE seconds, and comes back with the next watch, so
    an idle process holds no timer."""

    TICK = 0.05
    IDLE = 1.0

    def __init__(self) -> None:
        self._watched: dict[Expiring, None] = {}
        self._keeper: gevent.Greenlet | None = None

    def watch(self, item: Expiring) -> None:
        """From now until unwatch(item) or its expiry."""
        self._watched[item] = None
        if self._keeper is None:
            self._keeper = gevent.spawn(self._keep)

    def unwatch(self, item: Expiring) -> None:
        self._watched.pop(item, None)

    def _keep(self) -> None:
        idle = 0.0
        try:
            while self._watched or idle < self.IDLE:
                now = time.monotonic()
                wake = now + self.TICK
                for item in list(self._watched):
                    expires = item.expires
                    if expires <= now:
                        del self._watched[item]
                        item.expire()
                    else:
                        wake = min(wake, expires)
                idle = 0.0 if self._watched else idle + (wake - now)
                gevent.sleep(wake - now)
        finally:
            self._keeper = None
