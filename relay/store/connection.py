"""Connecting to Redis: one server, or a Redis Cluster behind the same kind of URL.

`connect` asks the server at the URL whether it runs in cluster mode (INFO cluster)
and answers with redis-py's cluster client if so: brokers, scanners, jobs,
relay-admin and the Spark connector are all given the same `redis://HOST:PORT/0`.

Brokers, scanners and `relay jobs` connect only once their Redis can serve
(`connect_when_ready`): started before it (a Procfile starts everything at once), or
before a cluster covers every slot, they wait, saying so in one line, since which
client `connect` gives depends on what answers at the URL.
"""

import logging
import time
from typing import Any, Callable, TypeAlias, TypeGuard, TypeVar
from urllib.parse import urlparse, urlunparse

import redis
from redis.backoff import ExponentialBackoff
from redis._parsers.commands import CommandsParser
from redis.cluster import RedisCluster
from redis.exceptions import (AskError, ClusterDownError, MovedError, RedisClusterException,
                              TryAgainError)
from redis.retry import Retry

from relay.options import redacted_url

# Errors after which a script call did not run and may simply be sent again: a slot
# is being moved (TRYAGAIN), or the cluster is changing its mind about one.
SLOT_MOVING = (TryAgainError, ClusterDownError, AskError, MovedError)
REQUEST_TTL = 200
# Connections a client opens to each server. On one server, calls beyond them wait for
# one to be free (up to the call's timeout) instead of failing with "Too many
# connections", as redis-py's default pool of 100 does.
MAX_CONNECTIONS = 100

# what `connect` gives: one server's client, or the cluster's
RedisClient: TypeAlias = redis.Redis | RedisCluster
T = TypeVar("T")

# what a call raises when Redis cannot be reached, or a cluster cannot serve the slot:
# the cluster client's "cannot be connected" and "slots not covered" are neither
# ConnectionError nor RedisError
UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
               ClusterDownError, RedisClusterException)
READY_TIMEOUT = 1.0     # seconds a readiness check waits for each answer
READY_EVERY = 0.2       # seconds between readiness checks


def connect(url: str, timeout: float | None = None, connect_timeout: float | None = None,
            health_check_interval: int = 0, cluster: bool | None = None):
    """A client for `url`: redis.Redis, or RedisCluster when the server is a cluster node
    (`cluster`: known to be one, or not; None: asked of the server, and a server that
    does not answer is taken for a single one)."""
    kwargs = {"socket_timeout": timeout, "socket_connect_timeout": connect_timeout}
    if not cluster:
        single = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(
            url, health_check_interval=health_check_interval,
            max_connections=MAX_CONNECTIONS, timeout=timeout, **kwargs))
        single.auto_close_connection_pool = True
        if cluster is False or not _cluster_enabled(single):
            return single
        single.close()
    # redis-py's cluster client may give a connection back twice on a redirect, which
    # only its default pool forgives: past MAX_CONNECTIONS per node a call fails there
    return _patient(RedisCluster.from_url(_without_db(url), retry=_retry(),
                                          max_connections=MAX_CONNECTIONS, **kwargs))


def connect_redis(options, cluster: bool | None = None):
    """A client with bounded waits, so an unreachable Redis fails calls instead of hanging;
    a cluster client if the URL names a cluster node (`cluster`: as connect takes it)."""
    timeout = options.redis_timeout / 1000
    return connect(options.redis_url, timeout, min(timeout, 2.0), health_check_interval=30,
                   cluster=cluster)


def whole(client: redis.Redis):
    """A client for the whole deployment that `client` is one connection into: the
    cluster client if its server is a cluster node (rq hands jobs a plain client)."""
    if not _cluster_enabled(client):
        return client
    kwargs = client.connection_pool.connection_kwargs
    return _patient(RedisCluster(host=kwargs["host"], port=kwargs["port"],
                                 username=kwargs.get("username"),
                                 password=kwargs.get("password"), retry=_retry()))


def node_url(client, key: str) -> str:
    """The URL of the cluster node that serves `key` now."""
    node = client.get_node_from_key(key)
    kwargs = client.get_redis_connection(node).connection_pool.connection_kwargs
    auth = ""
    if kwargs.get("password"):
        auth = f"{kwargs.get('username') or ''}:{kwargs['password']}@"
    return f"redis://{auth}{node.host}:{node.port}/0"


class CallKeys(CommandsParser):
    """redis-py's command parser, reading an FCALL's keys from the call as it does an
    EVALSHA's. It asked a server for them (COMMAND GETKEYS) on every FCALL it routed: a
    round trip each, to the client's default node, so with that node dead every call
    redis-py routed failed (tests/test_failover.py), other masters' too."""

    def __init__(self, parser: CommandsParser) -> None:
        """With the command table `parser` read: no COMMAND of its own, so making a
        client costs no round trip more (and cannot fail once the client is made)."""
        self.commands = parser.commands
        self.redis_connection = parser.redis_connection

    def get_keys(self, redis_conn: Any, *args: Any) -> Any:
        if str(args[0]).upper() in ("FCALL", "FCALL_RO"):
            return list(args[3:3 + int(args[2])]) or None
        return super().get_keys(redis_conn, *args)


def _patient(client: RedisCluster) -> RedisCluster:
    """redis-py follows MOVED/ASK and retries TRYAGAIN up to RedisClusterRequestTTL times
    per call (the second half 50 ms apart), then raises 'TTL exhausted' for the whole
    pipeline: 16 tries is under half a second, shorter than a slot move with many keys.
    200 gives about 5 s, and Store retries calls still refused after that. Its FCALLs
    are routed by their keys (CallKeys), its pipelines' too."""
    client.RedisClusterRequestTTL = REQUEST_TTL
    client.commands_parser = CallKeys(client.commands_parser)
    return client


def _retry() -> Retry:
    """redis-py's retries of a cluster call (connection lost, cluster down while a node
    fails over): up to 10, backing off to half a second."""
    return Retry(ExponentialBackoff(cap=0.5, base=0.02), 10)


def _cluster_enabled(client: redis.Redis) -> bool:
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    except redis.exceptions.ResponseError:
        return False  # a server without INFO cluster is no cluster
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return False  # unreachable now: callers retry and see it when it answers


def _without_db(url: str) -> str:
    """A cluster has database 0 only, and redis-py's cluster client takes no /0."""
    parts = urlparse(url)
    if parts.path in ("/0", "/"):
        parts = parts._replace(path="")
    return urlunparse(parts)


def is_cluster(client: Any) -> TypeGuard[RedisCluster]:
    return isinstance(client, RedisCluster)


def unready(url: str) -> str | None:
    """Why the Redis at `url` cannot serve yet (down, refusing, loading its data, a
    cluster whose state is not ok: slots not all covered); None once it can."""
    client = redis.Redis.from_url(url, socket_timeout=READY_TIMEOUT,
                                  socket_connect_timeout=READY_TIMEOUT)
    try:
        client.ping()
        if not _cluster_enabled(client):
            return None
        info = client.cluster("info")
        if info["cluster_state"] != "ok":
            return (f"cluster_state is {info['cluster_state']}, "
                    f"{info['cluster_slots_assigned']} of 16384 slots covered")
        return _unready_master(client)
    except redis.exceptions.RedisError as e:
        return str(e) or type(e).__name__
    finally:
        client.close()


def _unready_master(client: redis.Redis) -> str | None:
    """Why a master of the cluster that `client`'s node sees as ok does not say so yet:
    a forming cluster's nodes reach ok one by one, and a write routed to one still
    down is refused (CLUSTERDOWN)."""
    masters = {(host.decode() if isinstance(host, bytes) else host, int(port))
               for _, _, (host, port, *_), *_ in client.execute_command("CLUSTER SLOTS")}
    for host, port in sorted(masters):
        node = redis.Redis(host=host or "127.0.0.1", port=port, socket_timeout=READY_TIMEOUT,
                           socket_connect_timeout=READY_TIMEOUT)
        try:
            state = node.cluster("info")["cluster_state"]
        finally:
            node.close()
        if state != "ok":
            return f"cluster_state of the master at {host}:{port} is {state}"
    return None


def wait_until_ready(url: str, stopping: Callable[[], bool], log: logging.Logger,
                     sleep: Callable[[float], Any] = time.sleep) -> bool:
    """Until the Redis at `url` can serve, with no deadline: one line when it cannot
    (and why), one when it can. False if `stopping()` came true first (the caller says
    why it stops). `sleep` between checks: one a stop signal cuts short, for gevent."""
    started, said = time.monotonic(), False
    while not stopping():
        reason = unready(url)
        if reason is None:
            if said:
                log.info("redis at %s ready after %.1f s", redacted_url(url),
                         time.monotonic() - started)
            return True
        if not said:
            log.info("redis at %s not ready (%s): waiting for it", redacted_url(url), reason)
            said = True
        sleep(READY_EVERY)
    return False


def connect_when_ready(options, stopping: Callable[[], bool], log: logging.Logger,
                       sleep: Callable[[float], Any] = time.sleep, *,
                       first: "Callable[[RedisClient], T]") -> "tuple[RedisClient, T] | None":
    """connect_redis once the Redis of `options` can serve (wait_until_ready), and
    first(client): the process's first reads, its data layout; None if stopping first. A
    Redis that goes away between the check and these is waited for again (a scanner
    whose Redis was killed just as it came back died there with a traceback)."""
    while wait_until_ready(options.redis_url, stopping, log, sleep):
        client = None
        try:
            client = connect_redis(options)
            return client, first(client)
        except UNREACHABLE:
            if client is not None:
                client.close()
            sleep(READY_EVERY)
    return None
