"""The data source's options as its reader and writer take them: the Store they name and
the ones a read or write cannot do without."""

from relay.options import Options, parse_moment
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


def moment(options, name: str) -> int | None:
    """Option `name` as ms since the epoch: given as ms (digits) or ISO 8601 (UTC unless
    it says otherwise); None when absent. A value neither is refused in one line."""
    raw = options.get(name.lower())
    if raw is None or str(raw).strip() == "":
        return None
    try:
        return parse_moment(str(raw).strip())
    except ValueError:
        raise ValueError(f"relay data source option {name}={raw!r} is not a time: give ms "
                         f"since the epoch or ISO 8601 (e.g. 2026-11-25T10:00:00Z)") from None
