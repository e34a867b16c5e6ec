"""relay's own processes (broker, scanner, jobs, console) for one test."""

import os
import re
import subprocess
import sys

from relay import embedded


class Processes:
    """Broker and scanner processes for one test, on the shared real Redis (flushed)."""

    def __init__(self, redis_url, tmpdir):
        self.redis_url = redis_url
        self.tmpdir = tmpdir
        self.procs = []
        self.http_ports: dict[int, int] = {}
        self.lookupd_ports: dict[int, int] = {}

    def _start(self, command, args, env=None):
        log = open(os.path.join(self.tmpdir, f"{command}-{len(self.procs)}.log"), "w")
        full_env = {**os.environ, "REDIS_URL": self.redis_url, **(env or {})}
        proc = subprocess.Popen([sys.executable, "-m", "relay", command, *args],
                                stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                cwd=self.tmpdir)
        self.procs.append(proc)
        return proc

    def broker(self, *args, port=None, env=None):
        """Start a broker; returns (proc, port) once it accepts connections. Its HTTP
        port is `http_ports[port]`, its lookupd port `lookupd_ports[port]`."""
        port = port or embedded.free_port()
        http_port = self.http_ports.setdefault(port, embedded.free_port())
        lookupd_port = self.lookupd_ports.setdefault(port, embedded.free_port())
        return self._broker(args, port, http_port, lookupd_port, env), port

    def broker_sharing(self, port, *args):
        """Another broker on a running broker's TCP port (SO_REUSEPORT) with HTTP and
        lookupd ports of its own, so waiting for them waits for this broker; returns
        (proc, http_port) once it serves."""
        http_port = embedded.free_port()
        return self._broker(args, port, http_port, embedded.free_port(), None), http_port

    def _broker(self, args, port, http_port, lookupd_port, env):
        proc = self._start("broker", ["--tcp-address", f"127.0.0.1:{port}",
                                      "--http-address", f"127.0.0.1:{http_port}",
                                      "--lookupd-http-address", f"127.0.0.1:{lookupd_port}",
                                      *args], env)
        embedded.wait_for_port("127.0.0.1", port, proc)
        embedded.wait_for_port("127.0.0.1", http_port, proc)
        embedded.wait_for_port("127.0.0.1", lookupd_port, proc)
        return proc

    def scanner(self, *args):
        return self._start("scanner", list(args))

    def jobs(self, *args):
        """`relay jobs`: the rq worker for relay-admin's jobs."""
        return self._start("jobs", list(args))

    def console(self, *args):
        """`relay console` on a port of its own; returns (proc, port) once it serves."""
        port = embedded.free_port()
        proc = self._start("console", ["--console-address", f"127.0.0.1:{port}", *args])
        embedded.wait_for_port("127.0.0.1", port, proc)
        return proc, port

    def stop_all(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def logs(self):
        out = []
        for name in sorted(os.listdir(self.tmpdir)):
            if name.endswith(".log"):
                with open(os.path.join(self.tmpdir, name)) as f:
                    out.append(f"--- {name}\n{f.read()}")
        return "\n".join(out)


def listening_ports(pid: int) -> set:
    """The TCP ports the process listens on (its sockets in /proc/net/tcp{,6})."""
    fd_dir = f"/proc/{pid}/fd"
    inodes = {link[len("socket:["):-1] for link in
              (os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir))
              if link.startswith("socket:[")}
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in list(f)[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    ports.add(int(cols[1].rpartition(":")[2], 16))
    return ports


def cpu_seconds(pid: int) -> float:
    """The CPU time the process has used (user and system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kb(pid: int) -> int:
    """The process's resident memory (VmRSS), in kB."""
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
