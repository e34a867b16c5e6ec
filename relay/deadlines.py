"""Deadlines of what a broker's greenlets wait on, kept by one greenlet.

A gevent Timeout per wait (a libev timer started and stopped, an exception object made)
cost the broker more than many waits themselves: a socket ping-pong between two
greenlets took about 2x as long with the reading socket's timeout set. The read of a
client's next command, its answer from Redis and a pump's heartbeat interval are each
such a wait, so they keep their deadlines here instead, in slots of TICK, and one
greenlet expires each at its time, reading only the slots coming due: its work follows
what expires, not what waits (10,000 idle connections cost it nothing but a wake-up
each TICK).
"""

import logging
import time
from typing import Protocol

import gevent

log = logging.getLogger("relay.deadlines")


class Expiring(Protocol):
    """A wait that may pass its deadline: `expires` (monotonic seconds, fixed while it is
    watched), and `expire()`, which ends the wait with its error without switching
    greenlets."""

    @property
    def expires(self) -> float: ...

    def expire(self) -> None: ...


class Deadlines:
    """What is watched is expired at its deadline, or up to TICK after it if watched while
    the keeper slept toward a later one (_keep). The keeping greenlet ends once nothing
    has been watched for IDLE seconds, and comes back with the next watch, so an idle
    process holds no timer."""

    TICK = 0.05
    IDLE = 1.0

    def __init__(self) -> None:
        self._slots: dict[int, dict[Expiring, None]] = {}   # slot -> what is due in it
        self._slot_of: dict[Expiring, int] = {}
        self._next = self._slot(time.monotonic())           # the first slot not expired
        self._keeper: gevent.Greenlet | None = None

    def _slot(self, when: float) -> int:
        """The slot of the first tick at or after `when`."""
        return int(when / self.TICK) + 1

    def watch(self, item: Expiring) -> None:
        """From now until unwatch(item) or its expiry."""
        slot = max(self._slot(item.expires), self._next)
        self._slot_of[item] = slot
        due = self._slots.get(slot)
        if due is None:
            due = self._slots[slot] = {}
        due[item] = None
        if self._keeper is None:
            self._keeper = gevent.spawn(self._keep)

    def unwatch(self, item: Expiring) -> None:
        slot = self._slot_of.pop(item, None)
        if slot is None:
            return
        due = self._slots[slot]
        del due[item]
        if not due:
            del self._slots[slot]

    def _expire(self, item: Expiring) -> None:
        self.unwatch(item)
        try:
            item.expire()
        except Exception:   # one item's error: the others still expire
            log.exception("expiring %r failed", item)

    def _past(self, last: int) -> "range | list[int]":
        """The slots from the first not expired to `last` (those held, after a pause)."""
        if last - self._next > len(self._slots):
            return sorted(slot for slot in self._slots if slot <= last)
        return range(self._next, last + 1)

    def _keep(self) -> None:
        """Expires the slots wholly past, and what is past in the slot of now; sleeps until
        the next deadline within a TICK (read from this slot and the next only), so one
        comes at its time unless it was watched after the sleep began with an earlier
        deadline than any before."""
        idle = 0.0
        try:
            while self._slots or idle < self.IDLE:
                now = time.monotonic()
                current = self._slot(now)
                for slot in self._past(current - 1):
                    for item in list(self._slots.get(slot, ())):
                        self._expire(item)
                self._next = max(self._next, current)
                wake = now + self.TICK
                for slot in (current, current + 1):
                    for item in list(self._slots.get(slot, ())):
                        expires = item.expires
                        if expires <= now:
                            self._expire(item)
                        else:
                            wake = min(wake, expires)
                idle = 0.0 if self._slots else idle + (wake - now)
                gevent.sleep(wake - now)
        finally:
            self._keeper = None
            self._next = self._slot(time.monotonic())
