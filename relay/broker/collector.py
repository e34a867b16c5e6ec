"""The garbage collector and the C allocator, for a broker of many long-lived connections.

CPython's full collection walks every object the collector tracks: about 800,000 at
10,000 idle consumers, 0.4-0.6 s of CPU during which no message moves. A trickle of
traffic promotes enough objects to the oldest generation (a FIN's pending reply, a
pump's new heartbeat timeout) to start one every 10-20 s, so a PUB now and then waited
for one. After each full collection its survivors, all reachable then, are frozen
(gc.freeze): later collections walk only what is newer. A closed connection or channel
leaves no reference cycle (reference counting frees it, frozen or not), so little can
be held back among the frozen; still, every UNFREEZE_EVERY seconds they are handed back,
and the next full collection walks them all once.

The youngest generation is collected every 100,000 allocations, not CPython's 700: a
collection walks only what is still alive of the young, so a message's short-lived
objects cost nothing, and 5,000 consumers taking a PUB each came through with a p99
of 16 ms instead of 40-74 (BENCHMARKS.md, idle channels).

glibc's malloc maps a block of its own for each allocation of MMAP_THRESHOLD bytes or
more and unmaps it when freed, but by default raises that threshold to the size of the
largest block freed (up to 32 MB), after which big blocks come from the heap and are
kept: ten consumers that stopped reading 1 MB messages left the broker 58 MB bigger
after they were gone. A fixed threshold gives such memory back (51 MB after, from 47).
"""

import ctypes
import ctypes.util
import gc

import gevent

UNFREEZE_EVERY = 3600.0
THRESHOLDS = (100_000, 50, 100)    # gc.set_threshold's
M_MMAP_THRESHOLD = -3               # glibc's mallopt parameter
MMAP_THRESHOLD = 256 * 1024


def _freeze_survivors(phase: str, info: dict) -> None:
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


def install() -> None:
    """Freeze the survivors of every full collection from now on (once per process), and
    fix malloc's threshold for blocks of their own (glibc only)."""
    _fix_mmap_threshold()
    gc.set_threshold(*THRESHOLDS)
    if _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)


def unfreeze_loop() -> None:
    """Now and then, let a full collection see the frozen objects again."""
    while True:
        gevent.sleep(UNFREEZE_EVERY)
        gc.unfreeze()


def _fix_mmap_threshold() -> None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    except (OSError, AttributeError):
        pass    # not glibc: its allocator keeps its own policy
