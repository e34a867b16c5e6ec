"""The data source's options as its reader and writer take them: the Store they name and
the ones a read or write cannot do without."""

from relay.options import Options
from relay.store import Store, replication
from relay.store.connection import connect


def store_of(options) -> Store:
    """The options' Store; its publishes (the sink's) wait for `wait_replicas` replicas,
    for half of `redis_timeout` (ms) at most, as a broker's with those options."""
    timeout = int(options.get("redis_timeout", Options.redis_timeout))
    waiting = replication(Options(wait_replicas=int(options.get("wait_replicas", 0)),
                                  redis_timeout=timeout))
    return Store(connect(options.get("redis_url", "redis://127.0.0.1:6379/0")), **waiting)


def required(options, *names) -> list:
    missing = [n for n in names if not options.get(n)]
    if missing:
        raise ValueError(f"relay data source needs option {missing[0]!r}")
    return [options[n] for n in names]
