"""The ScriptRunner runs script calls (Ops) as pipelines of FCALL commands.

The scripts are loaded once as one function library (FUNCTION LOAD, Redis 7+ and
Valkey: Library) and called by function name; where the server lacks it (a restart
without persistence, a new cluster node) it is loaded again and the failed calls retried.

On Redis Cluster the same calls go in one pipeline per node (_send_per_node). A call
refused because its slot is being moved (TRYAGAIN, or ASK/MOVED that redis-py's own
retries did not settle) did nothing, and is sent again until SLOT_MOVE_PATIENCE has
passed; a call whose script's batcher asks for it (a fan-out given a stale channel
list: relay/store/batchers.py) is sent again as the batcher builds it.

With `wait_replicas` N, a pipeline holding a publish ends with one WAIT N (WAITAOF 0 N
where the server fsyncs every write) per node that got a publish; when fewer than N
replicas confirm in time, that node's publishes fail (they may exist all the same).

A call whose connection was lost or timed out after it was sent fails with NoAnswer:
Redis may have run it. One that failed before (refused, not connected) did not run.
"""

import hashlib
import os
import re
import time
from importlib import resources
from typing import (TYPE_CHECKING, Any, Callable, Hashable, Iterable, NamedTuple, Sequence,
                    TypeVar, cast)

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, TryAgainError

from relay.errors import (NoAnswer, OutcomeUnknown, ServerTooOld, StoreConnectionError,
                          StoreError)
from relay.sockio import Turns, send_all
from relay.store import codes
from relay.store.causes import FUNCTION_NOT_FOUND, REFUSALS, cause, refusal
from relay.store.connection import SLOT_MOVING, RedisClient, is_cluster
from relay.store.resp import Replies, pack

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from redis.connection import AbstractConnection

    from relay.deadlines import Deadlines
    from relay.store.batchers import Batchers

# scripts acknowledged only once replicas hold their writes
REPLICATED = ("publish", "publish_commit", "publish_step", "redrive")
SLOT_MOVE_PATIENCE = 30.0
# The most arguments a call whose size a client drives may have (merged FINs, an MPUB's
# messages, a channel's consumers): bigger ones are split by their builders.
MAX_CALL_ARGS = 10_000
# Redis closes the connection on a command of more arguments than this (1024 * 1024 with
# FCALL, its function and key count): every call sharing the pipeline would fail, so such a
# call fails alone, before it is sent.
REDIS_MAX_ARGS = 1024 * 1024 - 3
# arguments packed for one send: a pipeline of many (a big MPUB's stage) gives the
# broker's other greenlets a turn between sends (packing 10,000 takes about 2 ms)
PACKED_ARGS = MAX_CALL_ARGS
CONNECTION_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
UNANSWERED = object()  # a pipeline's place whose reply was not read

_T = TypeVar("_T")


def identity(value: _T) -> _T:
    return value


def no_answer(error: Exception, conn: "AbstractConnection") -> NoAnswer:
    """What calls sent and not answered fail with. A read that timed out says what it
    waited for, in the words of a waiter's own deadline (commit.Bounded), which is as long
    and races it: the answer reads the same whichever comes first."""
    timeout = getattr(conn, "socket_timeout", None)
    if isinstance(error, redis.exceptions.TimeoutError) and timeout:
        return NoAnswer(f"no answer from redis within {timeout * 1000:.0f}ms")
    return NoAnswer(str(error))


class Op(NamedTuple):
    """One script call, as plain data: its script, keys and args, and `parse`, which
    reads its reply (a function of the reply alone). `pre`: plain commands sent just
    before it (results ignored). `calls`: how many calls it makes with those going on
    after it, as far as known (a client's patience is given once per call:
    relay/store/commit.py). `lane`: ops of one lane key go on one lane of a broker's
    group commit, whoever submits them (the ops that may merge meet there). `merge`: the
    key of the ops it may be merged with into one call, adding `size` to it (its
    arguments, about). `fan`: a call that names every channel of a topic part
    (batchers.FanOut). `job`: the plain values its script's batcher needs beyond these
    (relay/store/batchers.py: merging, sending again, going on)."""

    script: str
    keys: Sequence[str]
    args: Sequence[Any]
    parse: Callable[[Any], Any] = identity
    pre: tuple[tuple[Any, ...], ...] = ()
    calls: int = 1
    lane: Hashable = None
    merge: Hashable = None
    size: int = 0
    fan: Any = None
    job: Any = None


class Continued(NamedTuple):
    """run_many's result for an op whose `then` goes on, when told not to follow it:
    the Op to send next in its place (the group commit sends it in a later pipeline)."""

    op: Op


class Script(NamedTuple):
    name: str       # its file's, scripts/<name>.lua
    function: str   # what FCALL names: <name>_<the library's hash>


# the scripts refused as a whole while Redis is at maxmemory (their function has no
# allow-oom flag): those that add messages, so a publish is the back-pressure and an
# MPUB all or nothing. Every other script goes on there (allow-oom): those that free
# memory or only move data, and the processes' bookkeeping and reads of the news.
REFUSED_AT_MAXMEMORY = ("publish", "publish_commit", "stage", "redrive", "replay")
LIBRARY_PREFIX = "relay_"
NEEDS_FUNCTIONS = "relay needs Redis 7.0 or newer, or Valkey 7.2 or newer (FUNCTION and FCALL)"


class Library(NamedTuple):
    """relay's scripts as one Redis function library: each script a function, the lib
    files they include defined once at load, not again on every call (issue 59: that
    was 4 us of a deliver call). The name holds a hash of the code, so two releases'
    libraries live side by side through a rolling upgrade."""

    name: str
    code: str
    scripts: dict[str, Script]


def load_library(sharded: bool = False) -> Library:
    """Each script of scripts/ as a function of one library, after the shared files
    (scripts/lib/) that the scripts name on their first line as `-- include: X.lua, Y.lua`,
    each once, with what it names itself before it, and with the values of the codes it
    names (relay/store/codes.py) in place of their names. A function sets the call's
    KEYS and ARGV, which the lib files read as they did as scripts, first. Every function
    may reach keys of other slots of its node (allow-cross-slot-keys: the node keys,
    relay/store/nodes.py). Where `sharded` (a cluster): wake-ups by SPUBLISH."""
    folder = resources.files("relay.store") / "scripts"
    included: set[str] = set()
    shared, bodies = b"", []
    for path in sorted(folder.iterdir(), key=lambda p: p.name):
        if path.name.endswith(".lua"):
            source = path.read_bytes()
            shared += with_includes(folder / "lib", source, included)[:-len(source)]
            bodies.append((path.name[:-len(".lua")], source))
    code = b"local KEYS, ARGV   -- this call's: each function sets them first\n" + shared
    for name, source in bodies:
        flags = b"'allow-cross-slot-keys'" if name in REFUSED_AT_MAXMEMORY else \
            b"'allow-cross-slot-keys', 'allow-oom'"
        code += (b"redis.register_function{function_name = '" + name.encode()
                 + b"_HASH', flags = {" + flags + b"}, callback = function(keys, args)\n"
                 + b"KEYS, ARGV = keys, args\n" + source + b"\nend}\n")
    code = codes.inline(code)
    if sharded:
        code = code.replace(b"redis.call('PUBLISH'", b"redis.call('SPUBLISH'")
    digest = hashlib.sha1(code).hexdigest()[:12]
    code = (b"#!lua name=" + LIBRARY_PREFIX.encode() + digest.encode() + b"\n"
            + code.replace(b"_HASH', flags", b"_" + digest.encode() + b"', flags"))
    return Library(LIBRARY_PREFIX + digest, code.decode(),
                   {name: Script(name, f"{name}_{digest}") for name, _ in bodies})


def with_includes(lib: "Traversable", source: bytes, included: set[str]) -> bytes:
    """`source` after the lib files its first line names that are not in `included`
    yet (which it adds them to), each after its own."""
    named = re.match(rb"-- include: ([^\n]+)\n", source)
    first = b""
    for name in (n.strip().decode() for n in named.group(1).split(b",")) if named else ():
        if name not in included:
            included.add(name)
            first += with_includes(lib, (lib / name).read_bytes(), included)
    return first + source


def masters(client: RedisClient) -> list:
    """The server, or a client of each master of a cluster: where libraries live."""
    if is_cluster(client):
        return [client.get_redis_connection(node) for node in client.get_primaries()]
    return [client]


def libraries(server: Any) -> list[str]:
    """The names of relay's function libraries loaded on one server, each release's."""
    names = []
    for library in server.function_list(library=LIBRARY_PREFIX + "*"):
        fields = library if isinstance(library, dict) else \
            dict(zip(library[::2], library[1::2]))     # RESP2: name, value, ...
        names.append(fields[b"library_name"].decode())
    return sorted(names)


def install(client: RedisClient, library: Library) -> None:
    """FUNCTION LOAD of the library on the server, or on each master of a cluster, where
    it is not loaded yet. Its name holds its code's hash, so a library of that name is
    this one: loading it again would compile it again, 4.5 ms of Redis on Valkey 8 for
    every Store a process or a relay-admin command makes, and at maxmemory Redis
    refuses any FUNCTION LOAD (relay-admin could not empty a channel there). On a
    server without functions, the one line that says which server relay needs."""
    for server in masters(client):
        try:
            if not server.function_list(library=library.name):
                server.function_load(library.code)
        except redis.exceptions.ResponseError as e:
            if "already exists" in str(e):     # another process loaded it meanwhile
                continue
            if "unknown command" in str(e).lower():
                raise ServerTooOld(NEEDS_FUNCTIONS) from None
            raise


def unloaded(reply: Any) -> bool:
    """Whether a call's reply says the server lacks relay's library."""
    return isinstance(reply, redis.exceptions.ResponseError) and \
        str(reply).startswith(FUNCTION_NOT_FOUND)


# a lost or timed-out connection, which a cluster client's "cannot be connected" (no node
# answers) is raised from too
UNREACHABLE_CAUSES = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def guarded(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), with a lost or timed-out connection (or a cluster none of whose nodes
    answers) raised as StoreConnectionError, and a refusal (out of memory, persistence
    failing...) as StoreError of its cause."""
    try:
        return fn(*args)
    except UNREACHABLE_CAUSES as e:
        raise StoreConnectionError(str(e)) from e
    except redis.exceptions.ResponseError as e:
        raise StoreError(cause(e)) from e
    except RedisClusterException as e:
        if isinstance(e.__cause__, UNREACHABLE_CAUSES):    # "cannot be connected"
            raise StoreConnectionError(str(e)) from e
        raise StoreError(str(e)) from e     # the client's own, e.g. keys of two slots
    except AttributeError as e:
        if not _from_cluster_client(e):
            raise
        # redis-py's cluster client, its slot map in flux while slots move, picks a node
        # None for a slot ("'NoneType' object has no attribute 'redis_connection'":
        # redis/redis-py#3835, open): a scanner died of it; the next call finds the map
        raise StoreConnectionError(f"the cluster's slot map is changing: {e}") from e


def _from_cluster_client(error: Exception) -> bool:
    """Whether the error was raised inside redis-py's cluster client (redis/cluster.py)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.endswith(
        os.path.join("redis", "cluster.py"))


class ScriptRunner:
    """Runs Ops on one client: a single server or a cluster."""

    def __init__(self, client: RedisClient, batchers: "Batchers", dedicated: bool = False,
                 wait_replicas: int = 0, wait_timeout: int = 0) -> None:
        """`batchers`: the Store's (relay/store/batchers.py). `dedicated`: pipelines go over one connection of their own; only for a
        single caller at a time, as the broker's group commit (one server only).
        `wait_replicas`: replicas that must hold a publish before it succeeds, waited
        for `wait_timeout` ms."""
        self.redis = client
        self.cluster = is_cluster(client)
        self.dedicated = dedicated and not self.cluster
        self._connection: "AbstractConnection | None" = None
        self._replies: Replies | None = None    # of _connection, made at each connect
        self.turns = Turns()
        self.library = load_library()
        self.sharded: bool | None = None
        self._loaded = False
        self.wait_replicas = wait_replicas
        self.wait_timeout = wait_timeout
        self.wait_command: tuple[Any, ...] | None = None
        self.batchers = batchers
        # who keeps the read deadlines of its dedicated connection (a broker's group
        # commit: resp.Replies), else its socket timeout does
        self.deadlines: "Deadlines | None" = None

    def load_library(self) -> None:
        if self.sharded is None:
            self.sharded = self.cluster     # wake-ups by SPUBLISH on a cluster
            self.library = load_library(self.sharded)
        if self.wait_replicas and self.wait_command is None:
            self.wait_command = self._wait_command()
        install(self.redis, self.library)
        self._loaded = True

    def ensure_loaded(self) -> None:
        if not self._loaded:
            guarded(self.load_library)

    def run(self, op: Op) -> Any:
        result = self.run_many([op])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def run_many(self, ops: Sequence[Op], follow: bool = True) -> list:
        """Run ops in one pipeline; each result is a value or the exception for that op.
        Unless `follow`, an op that goes on (Batcher.next) is not run on: its result is
        a Continued."""
        self.ensure_loaded()
        ops = [self.batchers.of(op).built(op) for op in ops]
        results = guarded(self._execute, ops)
        self._again(ops, results, follow)
        out: list = []
        for op, r in zip(ops, results):
            batcher = self.batchers.of(op)
            after = batcher.next(op, r) if not isinstance(r, Exception) else None
            if after is not None:
                out.append(Continued(after))
                continue
            if isinstance(r, redis.exceptions.RedisError):
                refused = refusal(r)
                if refused and op.script in REPLICATED:
                    REFUSALS.met(refused)
                r = StoreError(refused or cause(r))
            elif op.script in REPLICATED and not isinstance(r, Exception):
                REFUSALS.cleared()
            out.append(r if isinstance(r, Exception) else batcher.read(op, r))
        return out

    def _wait_command(self) -> tuple[Any, ...]:
        """WAITAOF 0 N where the server has it (Redis 7.2+, Valkey) and fsyncs every
        write (appendfsync always): a confirmation then also means on the replicas'
        disks. Under everysec WAITAOF waits for the next fsync, up to a second per
        pipeline, so there WAIT N: the replicas hold it in memory."""
        target = {"target_nodes": RedisCluster.RANDOM} if self.cluster else {}
        try:
            version = self.redis.info("server", **target)["redis_version"]
            fsync = self.redis.config_get("appendfsync", **target).get("appendfsync")
        except redis.exceptions.ResponseError:  # CONFIG refused: assume everysec
            return ("WAIT", self.wait_replicas, self.wait_timeout)
        if tuple(map(int, version.split(".")[:2])) >= (7, 2) and fsync == "always":
            return ("WAITAOF", 0, self.wait_replicas, self.wait_timeout)
        return ("WAIT", self.wait_replicas, self.wait_timeout)

    def _waits(self, commands: list) -> bool:
        """Whether commands sent together need a WAIT after them."""
        return self.wait_command is not None and any(
            c[0] == "FCALL" and c[1] in self._replicated for c in commands)

    @property
    def _replicated(self) -> set[str]:
        """The function names of the REPLICATED scripts."""
        return {self.library.scripts[name].function for name in REPLICATED}

    def _unconfirmed(self, reply: Any) -> StoreError | None:
        """The error of the writes a WAIT (WAITAOF) reply does not cover, or None: the
        writes were done on the master, and may be lost or kept."""
        if isinstance(reply, Exception):
            return OutcomeUnknown(f"replicas not confirmed: {cause(reply)}")
        confirmed = reply if isinstance(reply, int) else reply[1]
        if confirmed >= self.wait_replicas:
            return None
        return OutcomeUnknown(f"{confirmed} of {self.wait_replicas} replicas confirmed the "
                              f"write within {self.wait_timeout}ms")

    def _confirm(self, commands: list, raw: list, indexes: Iterable[int],
                 wait_reply: Any) -> None:
        """Publishes among `indexes` fail unless wait_reply confirms them."""
        error = self._unconfirmed(wait_reply)
        if error is None:
            return
        replicated = self._replicated
        for i in indexes:
            if commands[i][0] == "FCALL" and commands[i][1] in replicated \
                    and not isinstance(raw[i], Exception):
                raw[i] = error

    def refresh_slots(self) -> None:
        try:
            cast(RedisCluster, self.redis).nodes_manager.initialize()
        except redis.exceptions.RedisError:
            pass  # the next call tries again

    def _again(self, ops: list, results: list, follow: bool = True) -> None:
        """Send again, in place, the calls that found no function (a server restarted
        without persistence, or a new cluster node: the library is loaded again first) and that were refused
        while their slot moved, for SLOT_MOVE_PATIENCE, and those whose batcher asks for
        it (Batcher.again), then, if `follow`, the ops that go on after them (a staged
        publish's steps: Batcher.next) until none goes on."""
        patience = time.monotonic() + SLOT_MOVE_PATIENCE
        while True:
            again = []
            if any(unloaded(r) for r in results):
                guarded(self.load_library)
            for i, (op, r) in enumerate(zip(ops, results)):
                if isinstance(r, SLOT_MOVING) or unloaded(r):
                    if time.monotonic() < patience:
                        again.append(i)
                elif not isinstance(r, Exception):
                    batcher = self.batchers.of(op)
                    after = batcher.again(op, r)
                    if after is None and follow:
                        after = batcher.next(op, r)
                    if after is not None:
                        ops[i] = after
                        again.append(i)
            if not again:
                return
            if any(isinstance(results[i], SLOT_MOVING) for i in again):
                time.sleep(0.05)
            else:
                patience = time.monotonic() + SLOT_MOVE_PATIENCE
            try:
                answers = guarded(self._execute, [ops[i] for i in again])
            except StoreError as e:     # these fail alone: the others were answered
                answers = [e] * len(again)
            for i, r in zip(again, answers):
                results[i] = r

    def _execute(self, ops: Sequence[Op]) -> list:
        too_big = [len(op.keys) + len(op.args) > REDIS_MAX_ARGS for op in ops]
        if any(too_big):
            results = self._execute([op for op, big in zip(ops, too_big) if not big])
            answered = iter(results)
            return [StoreError(f"{op.script}: {len(op.keys) + len(op.args)} arguments, more "
                               f"than Redis takes") if big else next(answered)
                    for op, big in zip(ops, too_big)]
        commands: list = []
        for op in ops:
            commands.extend(op.pre)
            commands.append(("FCALL", self.library.scripts[op.script].function, len(op.keys),
                             *op.keys, *op.args))
        if self.cluster:
            raw = self._send_per_node(commands)
        else:
            waits = self._waits(commands)
            sent = commands + [self.wait_command] if waits else commands
            raw = self._send(sent) if self.dedicated else self._pipeline(sent)
            if waits:
                self._confirm(commands, raw, range(len(commands)), raw.pop())
        results, i = [], 0
        for op in ops:
            refused = [r for r in raw[i:i + len(op.pre)] if isinstance(r, Exception)
                       and refusal(r)]
            i += len(op.pre)
            # a call that failed after its commands before were refused (an MPUB's stage
            # at maxmemory) fails with their cause
            results.append(refused[0] if refused and isinstance(raw[i], Exception) else raw[i])
            i += 1
        return results

    def _pipeline(self, commands: list) -> list:
        pipe = self.redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return pipe.execute(raise_on_error=False)

    def _write(self, conn: "AbstractConnection", commands: list) -> None:
        """Pack and send the commands, PACKED_ARGS arguments at a time with a turn for
        the broker's other greenlets between (packing a big MPUB's stage took 0.5 s in
        one go); a pipeline of small calls is one send."""
        batch, args = [], 0
        for command in commands:
            batch.append(command)
            args += len(command)
            if args >= PACKED_ARGS:
                send_all(conn._sock, pack(batch))
                batch, args = [], 0
                self.turns.take()
        if batch:
            send_all(conn._sock, pack(batch))

    def _send(self, commands: list) -> list:
        """A pipeline on this runner's own connection, without redis-py's per-pipeline
        pool checkout and health checks, written in one send and read in RESP directly
        (relay/store/resp.py; the broker's group commit is its only user)."""
        conn = self._connection
        if conn is None:
            pool = cast(redis.Redis, self.redis).connection_pool    # dedicated: one server
            conn = self._connection = cast("AbstractConnection", pool.make_connection())
        try:
            if conn._sock is None or self._replies is None:
                conn.connect()
                self._replies = Replies(conn, self.deadlines)
            try:
                self._write(conn, commands)
            except OSError as e:
                raise NoAnswer(f"Error writing to socket: {e}") from e
            try:
                return self._replies.read(len(commands))
            except CONNECTION_ERRORS as e:
                raise no_answer(e, conn) from e
        except BaseException:
            conn.disconnect()
            self._replies = None
            raise

    def _send_per_node(self, commands: list) -> list:
        """A cluster pipeline of our own: each command goes to the node serving its first
        key's slot (a script's keys share one), all nodes written before any is read.
        redis-py's ClusterPipeline asks a server COMMAND GETKEYS for every FCALL it
        sends, a round trip each. Commands a node redirected (MOVED, ASK) or refused
        (TRYAGAIN) go again one by one through redis-py, which follows redirects and
        keeps its slot map. A node that cannot be reached (killed, failing over) fails
        its own commands only, and the slot map is read again."""
        cluster = cast(RedisCluster, self.redis)
        groups: dict = {}
        for i, command in enumerate(commands):
            key = command[3] if command[0] == "FCALL" else command[1]
            node = cluster.get_node_from_key(key)
            groups.setdefault(node.name, (node, []))[1].append(i)
        raw: list = [UNANSWERED] * len(commands)
        sent, lost = [], []
        try:
            for node, indexes in groups.values():
                node_commands = [commands[i] for i in indexes]
                if self._waits(node_commands):
                    node_commands.append(self.wait_command)
                pool = cluster.get_redis_connection(node).connection_pool
                try:
                    conn = pool.get_connection()
                except CONNECTION_ERRORS as e:
                    lost.append(indexes)
                    self._unreachable(commands, raw, indexes, StoreConnectionError(str(e)))
                    continue
                sent.append((pool, conn, indexes))
                try:
                    conn.send_packed_command(conn.pack_commands(node_commands))
                except CONNECTION_ERRORS as e:
                    lost.append(indexes)
                    self._unreachable(commands, raw, indexes, NoAnswer(str(e)))
            for _, conn, indexes in sent:
                if indexes in lost:
                    continue
                try:
                    for i in indexes:
                        raw[i] = _read(conn)
                    if self._waits([commands[i] for i in indexes]):
                        self._confirm(commands, raw, indexes, _read(conn))
                except CONNECTION_ERRORS as e:
                    lost.append(indexes)
                    self._unreachable(commands, raw, indexes, no_answer(e, conn))
        finally:
            for pool, conn, indexes in sent:
                if indexes in lost:
                    conn.disconnect()  # it may hold replies not read
                pool.release(conn)
        if lost:
            self.refresh_slots()  # a node may have failed over
        for i, r in enumerate(raw):
            if isinstance(r, SLOT_MOVING):
                raw[i] = self._redirected(commands[i])
                if self._waits([commands[i]]):
                    self._confirm(commands, raw, [i], self._wait_on(commands[i][3]))
        return raw

    def _unreachable(self, commands: list, raw: list, indexes: list[int],
                     failed: StoreConnectionError) -> None:
        """A node's commands left unanswered, and its publishes unconfirmed, fail with
        the lost connection's error (NoAnswer once they were sent)."""
        waits = self._waits([commands[i] for i in indexes])
        replicated = self._replicated
        for i in indexes:
            if raw[i] is UNANSWERED or (waits and commands[i][0] == "FCALL"
                                        and commands[i][1] in replicated):
                raw[i] = failed

    def _wait_on(self, key: str) -> Any:
        """WAIT on the node serving `key`, for a publish sent there alone."""
        assert self.wait_command is not None    # asked only where _waits said so
        cluster = cast(RedisCluster, self.redis)
        try:
            node = cluster.get_node_from_key(key)
            return cluster.get_redis_connection(node).execute_command(*self.wait_command)
        except redis.exceptions.RedisError as e:
            return e

    def _redirected(self, command: tuple[Any, ...]) -> Any:
        """A refused command through redis-py's cluster client, which follows MOVED/ASK.
        When redis-py gives up without an answer ('TTL exhausted', or its slot map
        caught half-updated), the command was not run: it counts as refused again, to
        be sent once more after a fresh look at the slots."""
        try:
            return self.redis.execute_command(*command)
        except CONNECTION_ERRORS as e:  # it may have been sent, and run
            return NoAnswer(str(e))
        except redis.exceptions.RedisError as e:
            return e
        except (RedisClusterException, AttributeError) as e:
            self.refresh_slots()
            return TryAgainError(f"{command[0]} not routed: {e}")


def _read(conn: "AbstractConnection") -> Any:
    """One reply of a pipeline; a command's error is its reply."""
    try:
        return conn.read_response()
    except redis.exceptions.ResponseError as e:
        return e
