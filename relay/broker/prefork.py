"""`relay broker --workers N`: a parent process and N brokers sharing its ports.

The parent binds every address first (sockio.reserve: port 0 becomes one free port, a
port another program holds fails here with the usual one line) and keeps the sockets
bound but not listening. Each worker is a full Broker, with its own id and
registration, that listens on the same ports with SO_REUSEPORT as separate brokers do:
the kernel spreads new connections over the workers' accept queues, and the port stays
held while a worker is replaced.

Workers are forked, not spawned: until then the parent has only read its options and
bound sockets (no gevent hub, Redis connection or thread: relay.cli imports none of
them), so a child is as clean as a new interpreter, starts without reading the options
again, and patches with gevent itself.

The parent forwards SIGTERM and SIGINT to the workers, which drain as any broker does,
and exits when all have: status 0, or the first failure's. A worker that exits while
serving is replaced, with one warning line; one that exits before it listens (a bad
certificate) stops them all with its status, as its replacement would fail the same way.
"""

import dataclasses
import logging
import os
import signal
import sys
import traceback
from typing import Callable

from relay.lifetime import end_with_parent
from relay.options import Options
from relay.sockio import reserve

log = logging.getLogger("relay.prefork")

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class Workers:
    def __init__(self, options: Options, serve: Callable[[Options, Callable], int]):
        """Bind the ports (an OSError names one that cannot be). `serve(options, started)`
        runs one broker in a worker and returns its exit status."""
        self.reserved = {name: reserve(address)
                         for name, address in listen_addresses(options).items()}
        self.options = dataclasses.replace(options, **{  # type: ignore[arg-type]
            name: f"{getattr(options, name).rpartition(':')[0]}:{sock.getsockname()[1]}"
            for name, sock in self.reserved.items()})
        self.serve = serve
        self.pids: dict[int, int] = {}  # pid -> worker number
        self.stopping = False
        self.status = 0

    def run(self) -> int:
        """Start the workers, keep them running until SIGTERM/SIGINT; the exit status."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._stop)
        self._start([1])  # alone: a bad option fails once, in one line
        if not self.stopping:
            self._start(range(2, self.options.workers + 1))
        if not self.stopping:
            log.info("broker with %d workers (pids %s) on %s", len(self.pids),
                     ",".join(map(str, self.pids)), " ".join(
                         f"{name.removesuffix('_address').removesuffix('_http')}="
                         f"{getattr(self.options, name)}" for name in self.reserved))
        while self.pids:
            pid, status = os.wait()
            if pid in self.pids:
                self._ended(pid, self.pids.pop(pid), os.waitstatus_to_exitcode(status), True)
        return self.status

    def _stop(self, sig=signal.SIGTERM, frame=None) -> None:
        """Pass the stop signal on to every worker; none is started after it."""
        self.stopping = True
        for pid in self.pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _start(self, numbers) -> None:
        """Fork these workers and wait until each listens or exits."""
        started = [forked for forked in map(self._fork, numbers) if forked]
        for pid, ready in started:
            listening = os.read(ready, 1)
            os.close(ready)
            if not listening and pid in self.pids:
                status = os.waitpid(pid, 0)[1]
                self._ended(pid, self.pids.pop(pid), os.waitstatus_to_exitcode(status), False)

    def _ended(self, pid: int, number: int, code: int, listened: bool) -> None:
        """A worker exited: a failure to report when stopping or before it listened,
        else one to replace."""
        if self.stopping:
            if code and -code not in STOP_SIGNALS and not self.status:
                self.status = _exit_status(code)
        elif not listened:
            self.status = _exit_status(code)
            self._stop()
        else:
            log.warning("broker worker %d (pid %d) exited with %s; starting another",
                        number, pid, _described(code))
            self._start([number])

    def _fork(self, number: int) -> tuple | None:
        """(pid, the read end of a pipe the worker writes to once it listens), or None
        when stopping. Stop signals wait until the new pid is known, so each worker gets
        them, and the child never runs the parent's handler."""
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            if self.stopping:
                return None
            ready, ready_w = os.pipe()
            parent = os.getpid()
            pid = os.fork()
            if pid == 0:
                os.close(ready)
                self._child(parent, ready_w)
            os.close(ready_w)
            self.pids[pid] = number
            return pid, ready
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def _child(self, parent: int, ready_w: int) -> None:
        """Serve as one broker, then leave at once (os._exit: none of the parent's exit
        handling runs twice)."""
        code = 1
        try:
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            for sock in self.reserved.values():
                sock.close()
            if _dies_with(parent):
                code = self.serve(self.options, lambda: (os.write(ready_w, b"1"),
                                                         os.close(ready_w)))
            else:
                code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def listen_addresses(options: Options) -> dict:
    """The options naming an address a broker listens on (those that are on)."""
    names = ["tcp_address", "http_address", "lookupd_http_address"]
    if options.tls_cert:
        names.append("https_address")
    return {name: getattr(options, name) for name in names if getattr(options, name)}


def _dies_with(parent: int) -> bool:
    """Have the kernel send this worker SIGTERM when the parent dies (Linux), so a parent
    killed with -9 leaves no broker behind; False if it is gone already."""
    end_with_parent()
    return os.getppid() == parent


def _exit_status(code: int) -> int:
    """A worker's status as a shell reports it: killed by signal N is 128 + N."""
    return 128 - code if code < 0 else code


def _described(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"
