"""Child processes that end with their parent: a broker's forked workers and the rq
worker of `relay jobs` get SIGTERM from the kernel when the process that started them
dies, however it dies (kill -9 included), so none is left behind serving or retrying
on its own."""

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1    # prctl(2), linux/prctl.h


def end_with_parent() -> None:
    """Ask the kernel for SIGTERM when the parent dies (Linux; elsewhere nothing): call
    in the child, after fork (or as Popen's preexec_fn)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
