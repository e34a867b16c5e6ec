"""Queue state in Redis: the key schema, the Lua scripts and the Store that calls them."""

from relay.store.store import Op, Store, connect_redis

__all__ = ["Op", "Store", "connect_redis"]
