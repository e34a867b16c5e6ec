"""Free ports for tests run by pytest-xdist workers.

Brokers listen with SO_REUSEPORT, so two workers handed the same free port by the
kernel (between one's check and its broker's bind) would both bind it and answer each
other's requests. Each worker therefore takes its ports from a range of its own, below
the kernel's ephemeral range (and with room for the cluster bus ports, port + 10000).
"""

import itertools
import os
import socket

FIRST = 10_000
SPAN = 2_000
RANGES = 5      # 10000-19999; bus ports 20000-29999; the ephemeral range starts at 32768


def worker_free_port(fallback):
    """A free_port() for this xdist worker, or `fallback` outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not name.startswith("gw"):
        return fallback
    start = FIRST + SPAN * (int(name[2:]) % RANGES)
    candidates = itertools.cycle(range(start, start + SPAN))

    def free_port() -> int:
        for port in candidates:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
        raise AssertionError("unreachable: the cycle never ends")
    return free_port
