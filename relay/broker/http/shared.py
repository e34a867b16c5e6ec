"""Heavy reads shared by the requests that ask for them at once: /stats, /metrics,
nsqlookupd's /nodes read thousands of keys each. N pollers of a broker with 5,000
channels cost it N such reads, and the loop that serves publishers and consumers
carried them all (issue 57: 4 pollers left a witness's PUB waiting 326 ms).

One read runs at a time per key (the request's arguments). A request that comes while
one runs waits for the next, which starts when the running one ends and answers every
request that came meanwhile: an answer is never read before its request arrived, so
what a client did before it asked is in it (as nsqd's /stats, read at each request),
and any number of pollers cost at most one read at a time.
"""

from typing import Callable, Hashable

import gevent
from gevent.event import AsyncResult


class SharedReads:
    def __init__(self) -> None:
        self._next: dict[Hashable, AsyncResult] = {}   # the read to start next, per key
        self._running: set[Hashable] = set()

    def read(self, key: Hashable, read: Callable[[], object]) -> object:
        """read()'s result, from a read begun after this call; raises what it raised."""
        pending = self._next.get(key)
        if pending is None:
            pending = self._next[key] = AsyncResult()
            if key not in self._running:
                self._running.add(key)
                gevent.spawn(self._reads, key, read)
        return pending.get()

    def _reads(self, key: Hashable, read: Callable[[], object]) -> None:
        """Reads for `key` back to back while requests wait for one."""
        try:
            while (pending := self._next.pop(key, None)) is not None:
                try:
                    pending.set(read())
                except Exception as e:  # every waiter raises it (an HttpError: its answer)
                    pending.set_exception(e)
        finally:
            self._running.discard(key)
