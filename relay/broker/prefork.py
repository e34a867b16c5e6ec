"""`relay broker --workers N`: a parent process and N brokers sharing its ports.

The parent binds every address first (sockio.reserve: port 0 becomes one free port, a
port another program holds fails here with the usual one line), once per worker: worker
K gets the sockets of slot K and, once Redis serves, listens on them (sockio.inherited),
with SO_REUSEPORT as separate brokers do: the kernel spreads new connections over the
workers' accept queues. The parent keeps its copy of each slot's sockets and accepts
nothing on them, so a slot's listener, with the connections in its accept queue, outlives
the worker serving it: the next worker of the slot takes them over.

Workers are forked, not spawned: until then the parent has only read its options and
bound sockets (no gevent hub, Redis connection or thread: relay.cli imports none of
them), so a child is as clean as a new interpreter, starts without reading the options
again, and patches with gevent itself.

The parent forwards SIGTERM and SIGINT to the workers, which drain as any broker does,
and exits when all have: status 0, or the first failure's. A worker that exits while
serving is replaced, with one warning line; one that exits before it listens (a bad
certificate) stops them all with its status, as its replacement would fail the same way.

SIGHUP is a rolling restart onto the code on disk: the parent checks that the new code
takes its command line and options (`relay broker ... --check`: a bad option or file
leaves the workers serving, with one error line), then execs itself (same pid, same
argv) with its sockets' fds and its workers' pids in RELAY_PREFORK_HANDOFF, so no port
is ever released. The new parent adopts the workers (still its children) and replaces
them one at a time: it forks the slot's next worker, waits until it serves (its ready
pipe), then sends the old one SIGTERM and waits until it has drained and exited. Both
share the slot's listener meanwhile: what is queued there is accepted by the new worker,
never reset. A replacement that exits before it serves ends the restart, the old
workers left serving.

The parent handles its signals synchronously (blocked, taken with sigtimedwait), so a
stop or a child's exit that comes while it forks, waits or execs is never lost: the
blocked set and what is pending survive exec.
"""

import dataclasses
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import Callable

from relay import sockio
from relay.lifetime import end_with_parent
from relay.options import Options
from relay.sockio import reserve

log = logging.getLogger("relay.prefork")

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
WATCHED = STOP_SIGNALS | {signal.SIGHUP, signal.SIGCHLD}
HANDOFF = "RELAY_PREFORK_HANDOFF"   # what a re-executed parent takes over (JSON)
POLL = 0.02     # how often a wait for a worker's ready pipe looks at signals
CHECK_TIMEOUT = 120     # for the new code to check the options before the parent execs


class Workers:
    def __init__(self, options: Options, serve: Callable[[Options, Callable], int]):
        """Bind the ports (an OSError names one that cannot be), or take over those of the
        parent this one re-executed, with its workers. `serve(options, started)` runs one
        broker in a worker and returns its exit status."""
        signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)     # taken by run(), in turn
        handoff = json.loads(os.environ.pop(HANDOFF, "null"))
        addresses = listen_addresses(options)
        # slot (worker number) -> option name -> a socket bound to its address
        self.slots: dict[int, dict[str, socket.socket]] = {}
        self.adopted: dict[int, int] = {}   # pid -> worker number, of the previous code
        if handoff:
            resolved = self._take_over(handoff, addresses)
        else:
            first = {name: reserve(address) for name, address in addresses.items()}
            resolved = {name: _resolved(addresses[name], sock)
                        for name, sock in first.items()}
            self.slots[1] = first
        self.options = dataclasses.replace(options, **resolved)
        self.addresses = {name: getattr(self.options, name) for name in addresses}
        for number in range(1, options.workers + 1):
            self._bind(number)
        self.serve = serve
        self.pids: dict[int, int] = {}  # pid -> worker number
        self.starting: dict[int, int | None] = {}   # pid -> exit code once reaped
        self.retiring: set[int] = set()     # sent SIGTERM by a rolling restart
        self.crashed: list[int] = []        # numbers of workers to start again
        self.stopping = False
        self.hangup = False
        self.status = 0

    # -- the main loop -----------------------------------------------------------

    def run(self) -> int:
        """Start the workers (or replace the adopted ones), keep them running until
        SIGTERM/SIGINT, restart them on SIGHUP; the exit status."""
        if self.adopted:
            self.pids.update(self.adopted)
            log.info("broker re-executed (pid %d): replacing its %d workers one at a time",
                     os.getpid(), len(self.adopted))
            self._roll(dict(self.adopted))
        else:
            self._start([1])  # alone: a bad option fails once, in one line
            if not self.stopping:
                self._start(range(2, self.options.workers + 1))
            if not self.stopping:
                log.info("broker with %d workers (pids %s) on %s", len(self.pids),
                         ",".join(map(str, self.pids)), " ".join(
                             f"{name.removesuffix('_address').removesuffix('_http')}="
                             f"{address}" for name, address in self.addresses.items()))
        while self.pids:
            if self.crashed and not self.stopping:
                self._start([self.crashed.pop(0)])
            elif self.hangup and not self.stopping:
                self.hangup = False
                self._reexec()
            else:
                self._signals(None)
        return self.status

    def _signals(self, timeout: float | None) -> None:
        """Act on the signals pending, waiting up to `timeout` s (None: no limit) for one."""
        info = signal.sigwaitinfo(WATCHED) if timeout is None \
            else signal.sigtimedwait(WATCHED, timeout)
        while info is not None:
            if info.si_signo == signal.SIGCHLD:
                self._reap()
            elif info.si_signo == signal.SIGHUP:
                self.hangup = True
            else:
                self._stop(info.si_signo)
            info = signal.sigtimedwait(WATCHED, 0)

    def _stop(self, sig: int = signal.SIGTERM) -> None:
        """Pass the stop signal on to every worker; none is started after it. The parent
        lets go of the listeners, so a connection arriving now is refused, as before."""
        self.stopping = True
        for pid in self.pids:
            _kill(pid, sig)
        for slot in self.slots.values():
            for sock in slot.values():
                sock.close()
        self.slots.clear()

    def _reap(self) -> None:
        """Collect every worker that exited."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not pid:
                return
            code = os.waitstatus_to_exitcode(status)
            number = self.pids.pop(pid, None)
            if number is None:
                continue
            if pid in self.starting:
                self.starting[pid] = code   # _wait_ready says what becomes of it
            elif self.stopping:
                self._failed(code)
            elif pid in self.retiring:
                self.retiring.discard(pid)
                if code and -code not in STOP_SIGNALS:
                    log.warning("broker worker %d (pid %d) exited with %s while draining",
                                number, pid, _described(code))
            else:
                log.warning("broker worker %d (pid %d) exited with %s; starting another",
                            number, pid, _described(code))
                self.crashed.append(number)

    def _failed(self, code: int) -> None:
        """A worker's exit while stopping: its status is the parent's unless it is 0, a
        stop signal's, or another failure came first."""
        if code and -code not in STOP_SIGNALS and not self.status:
            self.status = _exit_status(code)

    # -- starting workers --------------------------------------------------------

    def _start(self, numbers) -> None:
        """Fork these workers and wait until each listens or exits: one that exits first
        stops them all with its status."""
        started = [forked for forked in map(self._fork, numbers) if forked]
        for pid, number, ready in started:
            code = self._wait_ready(pid, number, ready)
            if code is not None:
                if self.stopping:
                    self._failed(code)
                else:
                    self.status = _exit_status(code)
                    self._stop()

    def _wait_ready(self, pid: int, number: int, ready: int) -> int | None:
        """None once the worker serves (it wrote to its ready pipe), else its exit status
        once it has exited. Signals are acted on meanwhile."""
        try:
            while not select.select([ready], [], [], POLL)[0]:
                self._signals(0)
            listening = os.read(ready, 1)
        finally:
            os.close(ready)
        if listening:
            code = self.starting.pop(pid)
            if code is not None and not self.stopping:  # served, and exited already
                log.warning("broker worker %d (pid %d) exited with %s; starting another",
                            number, pid, _described(code))
                self.crashed.append(number)
            return None
        while self.starting[pid] is None:     # it closed the pipe: it is exiting
            self._signals(POLL)
        return self.starting.pop(pid)

    def _fork(self, number: int) -> tuple | None:
        """(pid, number, the read end of a pipe the worker writes to once it listens),
        or None when stopping."""
        if self.stopping:
            return None
        ready, ready_w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(ready)
            self._child(number, parent, ready_w)
        os.close(ready_w)
        self.pids[pid] = number
        self.starting[pid] = None
        return pid, number, ready

    def _child(self, number: int, parent: int, ready_w: int) -> None:
        """Serve as one broker on the slot's sockets, then leave at once (os._exit: none
        of the parent's exit handling runs twice)."""
        code = 1
        try:
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, WATCHED)
            for slot, sockets in self.slots.items():
                for name, sock in sockets.items():
                    if slot == number:
                        sockio.inherited[self.addresses[name]] = sock
                    else:
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

    def _bind(self, number: int) -> None:
        """The sockets of a worker's slot, those it has not yet."""
        slot = self.slots.setdefault(number, {})
        for name, address in self.addresses.items():
            if name not in slot:
                slot[name] = reserve(address)

    # -- SIGHUP: a rolling restart -------------------------------------------------

    def _reexec(self) -> None:
        """Exec this program again, handing over the sockets and the workers; unless the
        code on disk does not import, then one error line and nothing changes."""
        began = time.monotonic()
        check = subprocess.run([*sys.orig_argv, "--check"], capture_output=True, text=True,
                               timeout=CHECK_TIMEOUT)
        if check.returncode:
            lines = check.stderr.strip().splitlines() or [f"status {check.returncode}"]
            log.error("SIGHUP: not restarting, the broker on disk would not start with "
                      "these options: %s", lines[-1])
            return
        slots = {}
        for number, sockets in self.slots.items():
            for sock in sockets.values():
                os.set_inheritable(sock.fileno(), True)
            slots[str(number)] = {name: sock.fileno() for name, sock in sockets.items()}
        handoff = {"slots": slots, "addresses": self.addresses,
                   "workers": {str(pid): number for pid, number in self.pids.items()}}
        log.info("SIGHUP: re-executing the broker (pid %d) on the code on disk (checked in "
                 "%.1f s)", os.getpid(), time.monotonic() - began)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        try:
            os.execve(sys.executable, sys.orig_argv,
                      {**os.environ, HANDOFF: json.dumps(handoff)})
        except OSError as e:
            log.error("SIGHUP: could not re-execute %s (%s); the workers keep serving",
                      sys.executable, e)

    def _take_over(self, handoff: dict, addresses: dict) -> dict:
        """The previous parent's sockets and workers; the addresses to serve on: each
        listener it had keeps its address (and port), one turned on since is bound now,
        one turned off is closed."""
        resolved = {name: address for name, address in handoff["addresses"].items()
                    if name in addresses}
        for number, sockets in handoff["slots"].items():
            for name, fd in sockets.items():
                sock = socket.socket(fileno=fd)
                os.set_inheritable(fd, False)
                if name in resolved:
                    self.slots.setdefault(int(number), {})[name] = sock
                else:
                    sock.close()
        for name, address in addresses.items():
            if name not in resolved:
                sock = reserve(address)
                resolved[name] = _resolved(address, sock)
                self.slots.setdefault(1, {})[name] = sock
        self.adopted = {int(pid): number for pid, number in handoff["workers"].items()}
        return resolved

    def _roll(self, old: dict[int, int]) -> None:
        """Replace these workers (pid -> number) one at a time by forks of this code: the
        new one serves before the old one is stopped; one past --workers just stops."""
        began = time.monotonic()
        replaced = 0
        for pid, number in sorted(old.items(), key=lambda item: item[1]):
            if self.stopping:
                return
            if pid not in self.pids:
                self.crashed = [n for n in self.crashed if n != number]
            if number <= self.options.workers:
                self._bind(number)
                if not self._replace(pid, number):
                    return
                replaced += 1
            else:       # --workers is fewer now
                if pid in self.pids:
                    self._retire(pid)
                for sock in self.slots.pop(number, {}).values():
                    sock.close()
        for number in range(1, self.options.workers + 1):   # new, or died meanwhile
            if number not in self.pids.values() and not self.stopping:
                self.crashed = [n for n in self.crashed if n != number]
                self._start([number])
        if not self.stopping:
            log.info("rolling restart done: %d workers replaced in %.1f s (pids %s)",
                     replaced, time.monotonic() - began, ",".join(map(str, self.pids)))

    def _replace(self, old: int, number: int) -> bool:
        """Start the slot's next worker; once it serves, stop the old one and wait until
        it has exited. False if the new one could not serve (the restart stops there)."""
        began = time.monotonic()
        forked = self._fork(number)
        if forked is None:
            return False
        code = self._wait_ready(*forked)
        if code is not None:
            if self.stopping:
                self._failed(code)
            else:
                log.error("rolling restart stopped: the new broker worker %d exited with %s "
                          "before it served; the old workers keep serving", number,
                          _described(code))
            return False
        ready = time.monotonic()
        if old in self.pids:
            self._retire(old)
        log.info("broker worker %d replaced: pid %d -> %d (serving after %.2f s, the old "
                 "one drained in %.2f s)", number, old, forked[0], ready - began,
                 time.monotonic() - ready)
        return True

    def _retire(self, pid: int) -> None:
        """SIGTERM to a worker, and wait until it has drained and exited."""
        self.retiring.add(pid)
        _kill(pid, signal.SIGTERM)
        while pid in self.pids:
            self._signals(None)
        self.retiring.discard(pid)


def listen_addresses(options: Options) -> dict:
    """The options naming an address a broker listens on (those that are on)."""
    names = ["tcp_address", "http_address", "lookupd_http_address"]
    if options.tls_cert:
        names.append("https_address")
    return {name: getattr(options, name) for name in names if getattr(options, name)}


def _resolved(address: str, sock: socket.socket) -> str:
    """The address with the port the socket has (port 0: the one it was given)."""
    return f"{address.rpartition(':')[0]}:{sock.getsockname()[1]}"


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


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
