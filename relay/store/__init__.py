"""Queue state in Redis: the key schema, the Lua scripts, the ScriptRunner that sends
their calls and the Store that makes them."""

from relay.store.base import replication
from relay.store.connection import connect_redis
from relay.store.runner import Op, guarded
from relay.store.store import Store

__all__ = ["Op", "Store", "connect_redis", "guarded", "replication"]
