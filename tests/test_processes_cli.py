"""The operator's edges of `relay`'s processes, run as real processes: which ports a
broker binds, the one line when it cannot, what each process's --help lists."""

import os
import re
import socket
import subprocess
import sys

import pytest

from relay import embedded
from relay.options import OPTION_NAMES, option_flag
from tests.helpers.processes import listening_ports
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def relay(*args, cwd, timeout=30) -> subprocess.CompletedProcess:
    """`python -m relay ARGS` to its end, in `cwd` (no conf/relay.toml there)."""
    return subprocess.run([sys.executable, "-m", "relay", *args], cwd=cwd, timeout=timeout,
                          capture_output=True, text=True)


@pytest.fixture
def started(tmp_path, single_redis_url):
    """Starts `python -m relay ARGS` in the background; the processes end with the test."""
    procs = []

    def start(*args):
        log = open(tmp_path / f"relay-{len(procs)}.log", "w+")
        proc = subprocess.Popen([sys.executable, "-m", "relay", *args], cwd=tmp_path,
                                stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "REDIS_URL": single_redis_url})
        proc.log = log
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(10)
        proc.log.close()


def log_line(proc, text: str, timeout: float = 15.0) -> str:
    """The first line of the process's log that holds `text`, once it is written."""
    def found():
        proc.log.seek(0)
        for line in proc.log:
            if text in line:
                return line.strip()
        assert proc.poll() is None, f"exited {proc.returncode}:\n{proc.log.read()}"
        return None
    line = wait_until(found, lambda line: line is not None, timeout, interval=0.05)
    if line is None:
        raise AssertionError(f"no {text!r} in the log after {timeout}s")
    return line


def held_port(host="127.0.0.1", port=0) -> socket.socket:
    """A listening socket that nobody may share (no SO_REUSEPORT), as another server's."""
    sock = socket.socket()
    sock.bind((host, port))
    sock.listen()
    return sock


# -- 17.2: a lookupd port only when asked ---------------------------------------------

def test_broker_runs_beside_nsqlookupd_and_binds_no_lookupd_port_unless_asked(started):
    try:
        nsqlookupd = held_port("0.0.0.0", 4161)  # where a real nsqlookupd listens
    except OSError:
        nsqlookupd = None                        # something holds it already: as good
    tcp, http = embedded.free_port(), embedded.free_port()
    proc = started("broker", "--tcp-address", f"127.0.0.1:{tcp}",
                   "--http-address", f"127.0.0.1:{http}")
    assert f" tcp=127.0.0.1:{tcp} http=127.0.0.1:{http} https=- lookupd=- " \
        in log_line(proc, "listening")
    assert listening_ports(proc.pid) == {tcp, http}
    if nsqlookupd:
        nsqlookupd.close()

    lookupd = embedded.free_port()
    tcp2, http2 = embedded.free_port(), embedded.free_port()
    proc = started("broker", "--tcp-address", f"127.0.0.1:{tcp2}", "--http-address",
                   f"127.0.0.1:{http2}", "--lookupd-http-address", f"127.0.0.1:{lookupd}")
    assert f" tcp=127.0.0.1:{tcp2} http=127.0.0.1:{http2} https=- lookupd=127.0.0.1:{lookupd} " \
        in log_line(proc, "listening")
    assert listening_ports(proc.pid) == {tcp2, http2, lookupd}


# -- 17.3: the error names the address that is taken -----------------------------------

@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("busy", ["tcp", "http", "lookupd-http", "https"])
def test_a_taken_port_is_named_in_one_line(busy, workers, pki, single_redis_url):
    ports = {name: embedded.free_port() for name in ("tcp", "http", "lookupd-http", "https")}
    holder = held_port(port=ports[busy])
    flags = [a for name, port in ports.items()
             for a in (f"--{name}-address", f"127.0.0.1:{port}")]
    result = relay("broker", *flags, "--tls-cert", "server.pem", "--tls-key", "server.key",
                   "--redis-url", single_redis_url, "--workers", workers, cwd=pki["folder"])
    holder.close()
    assert (result.returncode, result.stderr, result.stdout) == (
        1, f"relay: cannot listen on 127.0.0.1:{ports[busy]}: Address already in use\n", "")


def test_an_address_that_cannot_be_bound_is_named(tmp_path, single_redis_url):
    result = relay("broker", "--tcp-address", "192.0.2.1:4150", "--redis-url",
                   single_redis_url, cwd=tmp_path)
    assert (result.returncode, result.stderr) == (
        1, "relay: cannot listen on 192.0.2.1:4150: Cannot assign requested address\n")


# -- 17.4: each process's --help lists its own options --------------------------------

def help_flags(process: str, cwd) -> set:
    result = relay(process, "--help", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return set(re.findall(r"^  (--[a-z0-9-]+)", result.stdout, re.M))


SCANNER_ONLY = {"--queue-scan-interval", "--queue-scan-limit", "--dead-letter-topic"}
CONSOLE_ONLY = {"--console-address", "--console-write", "--console-auth-file"}


@pytest.mark.parametrize("process, flags", [
    ("scanner", {"--config", "--redis-url", "--redis-timeout", "--wait-replicas",
                 "--topic-partitions", "--retention-time", "--max-attempts",
                 "--log-level", "--help", *SCANNER_ONLY}),
    ("jobs", {"--config", "--redis-url", "--log-level", "--help"}),
    ("console", {"--config", "--redis-url", "--redis-timeout", "--wait-replicas",
                 "--log-level", "--help", *CONSOLE_ONLY}),
    ("redis", {"--config", "--redis-url", "--redis-conf", "--data-dir", "--cluster",
               "--replicas", "--help"}),
])
def test_each_process_lists_the_options_it_uses(process, flags, tmp_path):
    assert help_flags(process, tmp_path) == flags


def test_broker_lists_every_option_but_the_scanners_and_the_consoles(tmp_path):
    every = {f"--{option_flag(name)}" for name in OPTION_NAMES}
    assert help_flags("broker", tmp_path) == every - SCANNER_ONLY - CONSOLE_ONLY | {
        "--config", "--check", "--help"}


def test_broker_check_says_whether_a_broker_could_start_without_taking_its_ports(tmp_path):
    """`relay broker --check`, as SIGHUP of --workers runs it: the options and files,
    not the ports (the running broker holds them)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    tcp = f"127.0.0.1:{held.getsockname()[1]}"
    good = relay("broker", "--tcp-address", tcp, "--check", cwd=tmp_path)
    assert (good.returncode, good.stdout, good.stderr) == (
        0, "relay: the broker's options are good\n", "")
    bad = relay("broker", "--tcp-address", tcp, "--tls-cert", "c.pem", "--check", cwd=tmp_path)
    assert (bad.returncode, bad.stdout, bad.stderr) == (
        2, "", "relay: invalid tls_cert: give both tls_cert and tls_key\n")
    held.close()


def test_broker_help_explains_max_defer_timeout(tmp_path):
    result = relay("broker", "--help", cwd=tmp_path)
    text = " ".join(result.stdout.split())
    assert "--max-defer-timeout VALUE largest DPUB and /pub?defer= defer, e.g. 7d " \
        "(default: --max-req-timeout's value)" in text


@pytest.mark.parametrize("value, problem", [
    ("-5", "Must be greater than or equal to 0."),
    ("soon", "not a duration: 'soon' (use e.g. 250ms, 60s, 15m, 1h)"),
])
def test_bad_max_defer_timeout_stops_the_broker(tmp_path, value, problem):
    result = relay("broker", "--max-defer-timeout", value, cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (
        2, "", f"relay: invalid max_defer_timeout: {problem}\n")


def test_a_flag_of_another_process_is_refused(tmp_path):
    result = relay("scanner", "--tls-cert", "conf/server.pem", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == "Error: No such option '--tls-cert'."


# -- 25.8: nsqd's log level names -----------------------------------------------------

@pytest.mark.parametrize("source, level", [("flag", "warn"), ("config", "fatal"),
                                           ("env", "WARN"), ("flag", "warning")])
def test_nsqd_log_levels_are_accepted(source, level, started, tmp_path, monkeypatch):
    tcp = embedded.free_port()
    args = ["broker", "--tcp-address", f"127.0.0.1:{tcp}", "--http-address", ""]
    if source == "flag":
        args += ["--log-level", level]
    elif source == "config":
        (tmp_path / "conf").mkdir()
        (tmp_path / "conf" / "relay.toml").write_text(f'log_level = "{level}"\n')
    else:
        monkeypatch.setenv("RELAY_LOG_LEVEL", level)
    proc = started(*args)
    embedded.wait_for_port("127.0.0.1", tcp, proc)
    proc.terminate()
    assert proc.wait(15) == 0
    proc.log.seek(0)
    assert proc.log.read() == ""  # no info line: neither "listening" nor "stopping"


def test_an_unknown_log_level_is_one_line(tmp_path):
    result = relay("scanner", "--log-level", "verbose", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (
        2, "relay: invalid log_level: not one of debug, info, warn, error, fatal: "
           "'verbose'\n")


# -- 25.3: a certificate or key that cannot be used is named ---------------------------

@pytest.mark.parametrize("cert, key, ca, error", [
    ("conf/server.pem", "server.key", "",
     "--tls-cert conf/server.pem: No such file or directory"),
    ("server.pem", "conf/server.key", "", "--tls-key conf/server.key: No such file or directory"),
    ("server.pem", "server.key", "conf/ca.pem",
     "--tls-root-ca-file conf/ca.pem: No such file or directory"),
    ("server.pem", ".", "", "--tls-key .: Is a directory"),
    ("server.key", "server.key", "", "--tls-cert server.key: no PEM certificate in it"),
    ("server.pem", "server.pem", "", "--tls-key server.pem: no PEM private key in it"),
    ("server.pem", "other.key", "", "--tls-key other.key: not the key of --tls-cert server.pem"),
])
def test_a_certificate_or_key_that_cannot_be_used_is_named(cert, key, ca, error, pki):
    flags = ["--tls-cert", cert, "--tls-key", key] + (["--tls-root-ca-file", ca] if ca else [])
    result = relay("broker", *flags, "--tcp-address", f"127.0.0.1:{embedded.free_port()}",
                   "--http-address", "", cwd=pki["folder"])
    assert (result.returncode, result.stderr) == (2, f"relay: {error}\n")


# -- 25.9: one folder per embedded server ------------------------------------------------

def test_embedded_servers_on_two_ports_keep_apart_and_a_held_folder_is_refused(
        started, tmp_path):
    import redis as redis_py
    conf = os.path.join(ROOT, "conf", "redis.conf")  # AOF on
    first, second = embedded.free_port(), embedded.free_port()
    servers = {}
    for port in (first, second):
        servers[port] = started("redis", "--redis-url", f"redis://127.0.0.1:{port}/0",
                                "--data-dir", "data", "--redis-conf", conf)
        embedded.wait_for_port("127.0.0.1", port, servers[port])
        redis_py.Redis(port=port).set("written-on", port)
    assert sorted(os.listdir(tmp_path / "data")) == sorted([str(first), str(second)])
    for port in (first, second):
        assert redis_py.Redis(port=port).keys() == [b"written-on"]
        assert "appendonlydir" in os.listdir(tmp_path / "data" / str(port))    # AOF files

    again = relay("redis", "--redis-url", f"redis://127.0.0.1:{first}/0", "--data-dir",
                  "data", "--redis-conf", conf, cwd=tmp_path)
    assert (again.returncode, again.stderr) == (
        2, f"relay: data/{first} is in use by the server of pid {servers[first].pid}\n")
    assert redis_py.Redis(port=first).get("written-on") == str(first).encode()
