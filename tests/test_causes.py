"""Redis' errors as relay reports them (relay/store/causes.py): the cause, in one line,
without a function's name or line number, from the replies Redis 7 and Valkey give, as
redis-py's parser makes them exceptions."""

import pytest
from redis._parsers.base import BaseParser
from redis.cluster import RedisCluster

from relay.errors import StoreConnectionError
from relay.store.causes import cause
from relay.store.runner import guarded

FUNCTION = "deliver_2759dfa0c37a"


@pytest.mark.parametrize("reply, expected", [
    # the error of a command inside a function, the function after it
    (f"OOM command not allowed when used memory > 'maxmemory'. script: {FUNCTION}, on "
     "@user_function:108.", "redis is out of memory (maxmemory)"),
    # a function refused before it ran
    ("OOM command not allowed when used memory > 'maxmemory'.",
     "redis is out of memory (maxmemory)"),
    (f"MISCONF Errors writing to the AOF file: No space left on device script: {FUNCTION}, "
     "on @user_function:12.", "redis cannot write its AOF: No space left on device"),
    ("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to "
     "persist to disk. Commands that may modify the data set are disabled, because this "
     "instance is configured to report errors during writes if RDB snapshotting fails "
     "(stop-writes-on-bgsave-error option). Please check the Redis logs for details "
     "about the RDB error.", "redis refuses writes: it cannot save its RDB snapshots "
                            "(stop-writes-on-bgsave-error)"),
    ("READONLY You can't write against a read only replica.", "redis is a read-only replica"),
    ("CLUSTERDOWN The cluster is down", "the redis cluster is down"),
    ("CLUSTERDOWN Hash slot not served", "the redis cluster is down (a slot is not served)"),
    ("LOADING Redis is loading the dataset in memory", "redis is loading its data"),
    ("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN "
     "NOSCRIPT.", "redis is busy running a script"),
    ("Function not found",
     "redis has lost relay's functions and they could not be loaded again"),
    ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
     "the redis replica has lost its master"),
    # a function's own errors: Lua's, and the replies it makes, without the frame
    (f"ERR user_function:5: attempt to compare nil with number script: {FUNCTION}, on "
     "@user_function:5.", "attempt to compare nil with number"),
    ("the MPUB was not staged whole: redis refused part of it",
     "the MPUB was not staged whole: redis refused part of it"),
    ("WRONGTYPE Operation against a key holding the wrong kind of value",
     "WRONGTYPE Operation against a key holding the wrong kind of value"),
])
def test_an_error_is_told_by_its_cause(reply, expected):
    assert cause(BaseParser.parse_error(reply)) == expected


def test_a_slot_map_in_flux_inside_the_cluster_client_is_an_outage_not_a_crash():
    """redis-py's cluster client, given a node None for a slot while slots move, raises
    AttributeError from redis/cluster.py (redis/redis-py#3835): a scanner died of it in
    test_cluster. guarded makes it StoreConnectionError; any other AttributeError stays."""
    with pytest.raises(StoreConnectionError) as raised:
        guarded(RedisCluster.get_redis_connection, None, None)
    assert str(raised.value) == ("the cluster's slot map is changing: 'NoneType' object has "
                                 "no attribute 'redis_connection'")
    with pytest.raises(AttributeError):
        guarded(lambda: None.redis_connection)  # type: ignore[attr-defined]
