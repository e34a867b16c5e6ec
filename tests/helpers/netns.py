"""Hosts of their own for network faults: one network namespace per host, each joined
by a veth pair to a bridge that lives in a namespace of its own, so the machine's
network is never touched. Faults: a host's cable pulled (its bridge port down),
nftables rules in a host (random drops, a peer's address dropped), and a delaying TCP
proxy (tests/helpers/delay_proxy.py; the kernel here has no netem).

Every namespace is named after a prefix unique to the process and the Hosts, so
pytest-xdist workers never meet; `remove(prefix)` kills what runs in them and deletes
them, also for a run that died half way.
"""

import ctypes
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

SUBNET = "10.77.0"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_made = itertools.count()


def missing() -> str | None:
    """Why these hosts cannot be had here (not root, no iproute2, no nft, namespaces
    refused), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"no `{tool}` (apt-get install {package})"
    probe = f"rlprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add refused: {made.stderr.strip()}"
    try:
        rules = subprocess.run(["ip", "netns", "exec", probe, "nft", "add", "table", "inet", "t"],
                               capture_output=True, text=True)
        if rules.returncode != 0:
            return f"nft refused in a namespace: {rules.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def unique_prefix() -> str:
    """A namespace prefix no other process or Hosts of this one uses."""
    return f"rl{os.getpid()}x{next(_made)}-"


def remove(prefix: str) -> None:
    """Kill every process in the namespaces named `prefix*` and delete them (their veths
    and the bridge go with them)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in [line.split()[0] for line in listed.splitlines() if line.strip()]:
        if not name.startswith(prefix):
            continue
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Hosts:
    """Named hosts on one private bridge: host i of `names` is 10.77.0.(i+1)."""

    def __init__(self, names: tuple = ("redis", "brokers", "clients"), prefix: str = ""):
        self.prefix = prefix or unique_prefix()
        self.bridge = f"{self.prefix}br"
        self.names = list(names)
        self.procs: list[subprocess.Popen] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        _ip("netns", "add", self.bridge)
        _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge, "link", "set", "br0", "up")
        for name in self.names:
            ns = self.ns(name)
            _ip("netns", "add", ns)
            _ip("link", "add", "eth0", "netns", ns, "type", "veth",
                "peer", "name", self.port(name), "netns", self.bridge)
            _ip("-n", self.bridge, "link", "set", self.port(name), "master", "br0")
            _ip("-n", self.bridge, "link", "set", self.port(name), "up")
            _ip("-n", ns, "addr", "add", f"{self.addr(name)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def ns(self, name: str) -> str:
        return f"{self.prefix}{name}"

    @staticmethod
    def port(name: str) -> str:
        """The host's port on the bridge."""
        return f"p-{name}"[:15]

    def addr(self, name: str) -> str:
        return f"{SUBNET}.{self.names.index(name) + 1}"

    # -- processes -------------------------------------------------------------------

    def start(self, name: str, argv: list, log: str | None = None, **popen) -> subprocess.Popen:
        """A process on host `name` (ip netns exec), its output to the file `log`; it is
        killed by close()."""
        out = open(log, "ab") if log else subprocess.DEVNULL
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(name), *argv], stdout=popen.pop(
            "stdout", out), stderr=popen.pop("stderr", subprocess.STDOUT if log else out),
            **popen)
        self.procs.append(proc)
        return proc

    def python(self, name: str, module: str, *args: str, log: str | None = None,
               **popen) -> subprocess.Popen:
        """`python -m module args` on host `name`, with this process's environment."""
        return self.start(name, [sys.executable, "-m", module, *args], log, **popen)

    def connect(self, name: str, address: str, port: int, timeout: float = 1.0):
        """A TCP connection made from host `name` (the socket stays in its namespace)."""
        def connect():
            import socket
            return socket.create_connection((address, port), timeout=timeout)
        return self._inside(name, connect)

    def wait_for_port(self, name: str, address: str, port: int, proc=None,
                      timeout: float = 20.0) -> None:
        """Until something on `address:port` accepts a connection from host `name`."""
        deadline = time.monotonic() + timeout
        while True:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
            try:
                self.connect(name, address, port, timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nothing listens on {address}:{port}") from None
                time.sleep(0.05)

    def _inside(self, name: str, fn):
        """fn() in a thread moved into host `name`'s namespace (setns applies to the
        calling thread only, so the rest of this process stays where it was)."""
        outcome: dict = {}

        def run() -> None:
            fd = os.open(f"/run/netns/{self.ns(name)}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
                outcome["value"] = fn()
            except BaseException as e:
                outcome["error"] = e
            finally:
                os.close(fd)
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    # -- faults ----------------------------------------------------------------------

    def cut(self, name: str) -> None:
        """Pull host `name`'s cable: its port on the bridge goes down."""
        _ip("-n", self.bridge, "link", "set", self.port(name), "down")

    def mend(self, name: str) -> None:
        _ip("-n", self.bridge, "link", "set", self.port(name), "up")

    def drop(self, name: str, incoming: str, outgoing: str | None = None) -> None:
        """nftables rules in host `name` that drop the packets it receives matching
        `incoming` and those it sends matching `outgoing` (the same unless given), e.g.
        "meta l4proto tcp numgen random mod 20 0" (5% of TCP packets). undrop() removes
        them."""
        chain = "  chain {} {{ type filter hook {} priority 0; {} counter drop; }}\n"
        script = ("table inet faults {\n" + chain.format("in", "input", incoming)
                  + chain.format("out", "output", outgoing or incoming) + "}\n")
        self._nft(name, "-f", "-", input=script)

    def undrop(self, name: str) -> int:
        """Remove drop()'s rules: the packets they dropped."""
        listed = self._nft(name, "list", "table", "inet", "faults")
        self._nft(name, "delete", "table", "inet", "faults")
        return sum(int(n) for n in re.findall(r"counter packets (\d+)", listed))

    def _nft(self, name: str, *args: str, input: str | None = None) -> str:
        return subprocess.run(["ip", "netns", "exec", self.ns(name), "nft", *args], input=input,
                              text=True, check=True, capture_output=True).stdout

    # -- the end ---------------------------------------------------------------------

    def stop(self, proc: subprocess.Popen, timeout: float = 10.0) -> None:
        """SIGTERM, and SIGKILL past `timeout`."""
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        """Kill every process started here, then remove the namespaces (whatever else
        still runs in them is killed too)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        remove(self.prefix)

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
