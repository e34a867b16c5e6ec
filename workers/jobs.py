"""`relay jobs`: the rq worker that runs relay-admin's long operations (workers/operations.py),
supervised: started again when it dies, stopped gracefully on SIGTERM."""

import logging
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import redis
from redis.exceptions import RedisClusterException
from rq import Queue, Worker

from relay.errors import ConfigError
from relay.lifetime import STOPS, end_with_parent, stops_held
from relay.liveness import new_id
from relay.options import redacted_url
from relay.store.connection import (UNREACHABLE, connect, is_cluster, node_url, unready,
                                    wait_until_ready)
from relay.store.layout import LayoutRefused, Presence, establish
from workers.operations import QUEUE, QUEUE_KEY

log = logging.getLogger("relay.jobs")


FOLLOW_INTERVAL = 2.0
REFUSED = -1000     # the worker was stopped: the layout in force is one it cannot read


def worker_url(redis_url: str) -> str:
    """Where the rq worker connects. rq's worker takes no cluster client, but every rq
    key shares the hash tag {rq}: on a cluster it talks to the node serving that slot
    (if the slot moves, the worker fails on MOVED and is started again here; if its
    node dies, run_worker sees the slot served elsewhere and moves the worker)."""
    client = connect(redis_url, timeout=5, connect_timeout=2)
    return node_url(client, QUEUE_KEY) if is_cluster(client) else redis_url


def worker_connection(client):
    """The connection for an rq worker in this process (tests), as worker_url."""
    return redis.Redis.from_url(node_url(client, QUEUE_KEY)) if is_cluster(client) else client


def run_worker(rq: str, redis_url: str) -> int:
    """`relay jobs`: once Redis can serve (waited for without a deadline, in one line), an
    rq worker on QUEUE, started again when it dies (rq exits on some Redis errors during
    an outage). SIGTERM and SIGINT go to the worker, which ends its current job first
    (rq's warm shutdown); its exit code is ours, but 0 with one line if it failed because
    Redis was unreachable. They also end a wait for Redis, with status 0."""
    state: dict[str, Any] = {"stopping": False, "worker": None, "signal": 0}

    def forward(signum, _frame):
        state["stopping"], state["signal"] = True, signum
        if state["worker"] is not None:
            state["worker"].send_signal(signum)
    for sig in STOPS:
        signal.signal(sig, forward)
    while wait_until_ready(redis_url, lambda: state["stopping"], log):
        try:
            url = worker_url(redis_url)
            client = connect(redis_url, timeout=5, connect_timeout=2)
            presence = Presence(client, "jobs", new_id(), establish(client))
        except UNREACHABLE:
            continue  # gone again since it was ready: wait again
        except ConfigError as e:     # a layout it cannot read, a server too old
            print(f"relay: {e}", file=sys.stderr)
            return 2
        with stops_held():   # a stop during the Popen must reach the worker it starts
            if state["stopping"]:
                log.info("jobs stopped before their rq worker started")
                return 0
            worker = state["worker"] = subprocess.Popen(
                [rq, "worker", "--url", url, "--name", presence.id, QUEUE],
                preexec_fn=end_with_parent)
        code = _wait_while_served(worker, url, redis_url if _clustered(redis_url) else None,
                                  presence)
        _leave(presence)
        if code == REFUSED:
            return 2
        state["worker"] = None
        if state["stopping"] or code == 0:
            return _stopped(code or 0, state["signal"], redis_url, worker.pid)
        if code is None:
            continue  # started again at once, on rq's node
        log.warning("rq worker exited with %d; starting another once Redis answers", code)
        time.sleep(1)
    log.info("jobs stopped while waiting for redis at %s: no rq worker was running",
             redacted_url(redis_url))
    return 0


def _stopped(code: int, signum: int, redis_url: str, pid: int) -> int:
    """The exit status once the rq worker `pid` ended with `code` after a stop signal."""
    if code == -signum:
        _unregister(redis_url, pid)
        return 0
    reason = unready(redis_url) if code else None
    if reason is None:
        return code
    log.warning("redis unreachable while stopping (%s): rq worker %d could not deregister; "
                "rq forgets it when its heartbeat expires (rq's worker TTL)", reason, pid)
    return 0


def _unregister(redis_url: str, pid: int) -> None:
    """rq announces its worker before it handles signals: one that came in between ended
    it before it took a job (the stop that was asked for) but left it announced. Take the
    announcement back, as rq would have."""
    try:
        connection = worker_connection(connect(redis_url, timeout=5, connect_timeout=2))
        for worker in Worker.all(connection=connection, queue=Queue(QUEUE, connection=connection)):
            if worker.pid == pid and worker.hostname == socket.gethostname():
                worker.register_death()
    except (redis.exceptions.RedisError, RedisClusterException):
        log.warning("rq worker %d ended by a signal stays announced until its TTL", pid)


def _wait_while_served(worker: subprocess.Popen, url: str, redis_url: str | None,
                       presence: Presence) -> int | None:
    """The worker's exit code; None if it was stopped because rq's slot is served
    elsewhere now (its node died and a replica took over: rq would retry the dead
    address for ever), looked at every FOLLOW_INTERVAL when `redis_url` (a cluster's) is
    given; REFUSED if it was stopped because the data layout in force became one this
    release cannot read. The worker registers as a process of its release meanwhile."""
    while True:
        refused = _present(presence)
        if refused:
            log.critical("%s; stopping the rq worker and its job", refused)
            _stop_cold(worker)
            return REFUSED
        try:
            return worker.wait(FOLLOW_INTERVAL)
        except subprocess.TimeoutExpired:
            pass
        if redis_url is not None and _moved(url, redis_url):
            log.warning("rq's slot moved from %s: moving the worker", redacted_url(url))
            worker.terminate()
            _ended(worker)
            return None


def _present(presence: Presence) -> LayoutRefused | None:
    """Register the worker for another heartbeat; a refusal to go on, if any (an
    unreachable Redis is rq's to notice)."""
    try:
        return presence.heartbeat()
    except (redis.exceptions.RedisError, RedisClusterException):
        return None


def _leave(presence: Presence) -> None:
    try:
        presence.leave()
    except (redis.exceptions.RedisError, RedisClusterException):
        pass    # the registration expires by itself


def _stop_cold(worker: subprocess.Popen) -> None:
    """Stop the rq worker and the job it runs now (rq's cold shutdown: a second SIGTERM
    kills its work horse), so nothing more is written."""
    worker.terminate()
    time.sleep(0.2)
    worker.terminate()
    _ended(worker)


def _ended(worker: subprocess.Popen) -> None:
    """Wait for a worker sent SIGTERM; killed if it has not ended within 10 s."""
    try:
        worker.wait(10)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def _clustered(redis_url: str) -> bool:
    """Whether redis_url is a cluster (False while that cannot be told: then the worker
    is started again once Redis answers, as after any exit)."""
    try:
        client = connect(redis_url, timeout=5, connect_timeout=2)
        try:
            return is_cluster(client)
        finally:
            client.close()
    except (redis.exceptions.RedisError, RedisClusterException):
        return False


def _moved(url: str, redis_url: str) -> bool:
    """Whether a cluster serves rq's slot on another node than `url` now (False while
    that cannot be told)."""
    try:
        client = connect(redis_url, timeout=5, connect_timeout=2)
        try:
            return is_cluster(client) and node_url(client, QUEUE_KEY) != url
        finally:
            client.close()
    except (redis.exceptions.RedisError, RedisClusterException):
        return False
