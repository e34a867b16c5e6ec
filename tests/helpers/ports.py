"""Free ports for tests run by pytest-xdist workers.

Brokers listen with SO_REUSEPORT, so two workers handed the same free port by the
kernel (between one's check and its broker's bind) would both bind it and answer each
other's requests. Each worker therefore takes its ports from a range of its own, below
the kernel's ephemeral range, with each port's cluster bus port (port + 10000) free too:
an outgoing connection can take no port there between the check and a node's bind.
pytest run without xdist takes the last range: the kernel may hand one process the
same free port twice in a row, and a broker then listened for TCP and HTTP on one
port, the kernel sharing its connections between the two (a V2 client got an HTTP 400).
"""

import os

from relay.embedded import BUS_OFFSET, bindable

FIRST = 10_000
SPAN = 1_600
RANGES = 5      # xdist's; the 6th is a run without it: 10000-19599, bus ports 20000-29599


class WorkerPorts:
    """This worker's range, handed out from one cursor that wraps: free_port and
    free_ports never give a port again before the range has gone round."""

    def __init__(self, start: int):
        self.start, self.cursor = start, start

    def free_ports(self, count: int) -> int:
        """The first of `count` consecutive free ports, their bus ports free too."""
        for _ in range(SPAN):
            if self.cursor + count > self.start + SPAN:
                self.cursor = self.start
            first, self.cursor = self.cursor, self.cursor + 1
            if all(bindable(p) and bindable(p + BUS_OFFSET)
                   for p in range(first, first + count)):
                self.cursor = first + count
                return first
        raise AssertionError(f"no {count} consecutive free ports in {self.start}+{SPAN}")

    def free_port(self) -> int:
        return self.free_ports(1)


def worker_ports() -> WorkerPorts:
    """This xdist worker's ports, or those of a run without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not name.startswith("gw"):
        return WorkerPorts(FIRST + SPAN * RANGES)
    if int(name[2:]) >= RANGES:    # a shared range: two brokers on one port
        raise RuntimeError(f"at most {RANGES} xdist workers (pytest -n {RANGES})")
    return WorkerPorts(FIRST + SPAN * int(name[2:]))
