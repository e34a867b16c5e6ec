"""Child processes that end with their parent: a broker's forked workers and the rq
worker of `relay jobs` get SIGTERM from the kernel when the process that started them
dies, however it dies (kill -9 included), so none is left behind serving or retrying
on its own. A stop that comes while a child starts waits until its parent has it in
hand (`stops_held`), so it is stopped with the others."""

import contextlib
import ctypes
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1    # prctl(2), linux/prctl.h


def end_with_parent() -> None:
    """Ask the kernel for SIGTERM when the parent dies (Linux; elsewhere nothing): call
    in the child, after fork (or as Popen's preexec_fn)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


STOPS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stops_held():
    """Hold SIGTERM and SIGINT until the block ends, then act on them as their handlers
    would have: a stop raised between Popen and the list the process goes in would lose
    the process. Off the main thread (no handlers there) it holds nothing, nor does it
    hold an ignored signal (a child started in the block still inherits SIG_IGN)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list = []
    before: dict = {}
    try:
        for sig in STOPS:
            if signal.getsignal(sig) not in (None, signal.SIG_IGN):   # None: not Python's
                before[sig] = signal.signal(sig, lambda sig, _: held.append(sig))
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        for sig in held:
            signal.raise_signal(sig)
