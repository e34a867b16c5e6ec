"""Node-level keys: one due index and one news hash per Redis node, so that an idle
scanner or broker reads the state of all the topics it watches in one command per node,
whatever their number (issue 35).

    relay:due     ZSET  "<part> <channel>" -> that channel's score in its part's due
                        index (relay:{T}:due), or lower; the scanners read what is due
    relay:news    HASH  part -> its news, bumped with every wake-up (which names it);
                        the brokers read the parts they serve once a second

Those are the names on one server. On a cluster each node has a pair of its own,
`relay:{node-N}:due` and `relay:{node-N}:news`, where the tag `node-N` hashes to the
lowest slot the node serves: the scripts of a part write the pair of the node that
serves it (scripts/lib/node.lua), whose prefix the caller gives them as its slot map
has it (Nodes.prefix). The keys are not among a script's KEYS, which a cluster wants in
one slot: a function flagged allow-cross-slot-keys (runner.Library) may reach any key
of its own node. A write that a stale slot map sends to the wrong node fails alone
(redis.pcall) and is made up for: a scanner seeds its node indexes from the parts' own
indexes when it starts, reconnects or sees the slots move, and sweeps them all slowly
(workers/scanner.py); a broker reads a part's version key where the node hash has no
field for it (Reads.versions).
"""

from functools import lru_cache
from typing import Any, Iterable, cast

from redis import Redis
from redis.cluster import RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from relay.store.connection import RedisClient, is_cluster
from relay.store.keys import PREFIX, TopicKeys

SINGLE = f"{PREFIX}:"          # the prefix of the node keys on one server
DUE, NEWS = "due", "news"      # the node keys: prefix + name


@lru_cache(maxsize=None)
def slot_tag(slot: int) -> str:
    """The first of node-0, node-1, ... that hashes to `slot`."""
    n = 0
    while key_slot(f"node-{n}".encode()) != slot:
        n += 1
    return f"node-{n}"


def prefix_of_slot(slot: int) -> str:
    return f"{PREFIX}:{{{slot_tag(slot)}}}:"


def due_member(part: str, channel: str) -> str:
    """A channel's member in its node's due index (names hold no space)."""
    return f"{part} {channel}"


def split_member(member: bytes) -> tuple[str, str]:
    part, _, channel = member.decode().partition(" ")
    return part, channel


class Nodes:
    """The prefixes of the node keys, by the slot map of a client's cluster (one prefix,
    SINGLE, for one server)."""

    def __init__(self, client: RedisClient) -> None:
        self.redis = client
        self.cluster = is_cluster(client)
        self._lowest: dict[str, int] = {}   # node name -> the lowest slot it serves
        self._map: Any = None                # the slots map _lowest was read from
        self._topology: Any = None           # CLUSTER SLOTS as last checked
        self._owners: tuple[Any, list[int]] = (None, [])   # (slots map, owners())

    def prefix(self, part: str) -> str:
        """The prefix of the node keys of the node serving `part`."""
        if not self.cluster:
            return SINGLE
        return prefix_of_slot(self._lowest_slot(self._node_name(TopicKeys.of(part).due)))

    def prefixes(self) -> list[str]:
        """The prefix of every node's keys (masters of a cluster)."""
        if not self.cluster:
            return [SINGLE]
        return sorted({prefix_of_slot(slot) for slot in self._table().values()})

    def by_node(self, parts: Iterable[str]) -> dict[str, list[str]]:
        """The parts by the prefix of the node keys of the node serving them."""
        if not self.cluster:    # no look-up per part: the idle broker's read each second
            listed = list(parts)
            return {SINGLE: listed} if listed else {}
        groups: dict[str, list[str]] = {}
        for part in parts:
            groups.setdefault(self.prefix(part), []).append(part)
        return groups

    def owners(self) -> list[int]:
        """The master serving each slot, as its rank among the masters in the order of
        the lowest slot each serves (-1: none), by the client's slot map
        (relay/store/placement.py)."""
        slots = cast(RedisCluster, self.redis).nodes_manager.slots_cache
        if self._owners[0] is not slots:
            ranks = {name: rank for rank, (_, name) in
                     enumerate(sorted((s, n) for n, s in self._table(stale=True).items()))}
            self._owners = (slots, [ranks[slots[s][0].name] if slots.get(s) else -1
                                    for s in range(REDIS_CLUSTER_HASH_SLOTS)])
        return self._owners[1]

    def address(self, part: str) -> str:
        """host:port of the master serving `part` (of the server, on one server)."""
        if self.cluster:
            return self._node_name(TopicKeys.of(part).due)
        kwargs = cast(Redis, self.redis).connection_pool.connection_kwargs
        return f"{kwargs.get('host')}:{kwargs.get('port')}"

    def _node_name(self, key: str) -> str:
        return cast(RedisCluster, self.redis).get_node_from_key(key).name

    def _table(self, stale: bool = False) -> dict[str, int]:
        """node name -> the lowest slot it serves, by the client's slot map: read again
        when the client read a new map, or when `stale`."""
        slots = cast(RedisCluster, self.redis).nodes_manager.slots_cache
        if stale or slots is not self._map:
            lowest: dict[str, int] = {}
            for s in range(REDIS_CLUSTER_HASH_SLOTS):
                if slots.get(s):
                    lowest.setdefault(slots[s][0].name, s)
            self._lowest, self._map = lowest, slots
        return self._lowest

    def _lowest_slot(self, name: str) -> int:
        """The lowest slot node `name` serves (the table read again if its entry no
        longer holds: redis-py moves a slot in its map in place on a MOVED)."""
        slot = self._table().get(name)
        slots = self._map
        if slot is None or not slots.get(slot) or slots[slot][0].name != name:
            slot = self._table(stale=True).get(name)
        if slot is None:
            raise KeyError(f"no slot served by {name}")
        return slot

    def moved(self) -> bool:
        """Whether the cluster's slots changed hands since the last call (a first call
        only reads them): then the client's slot map is read again. One CLUSTER SLOTS;
        False on one server."""
        if not self.cluster:
            return False
        cluster = cast(RedisCluster, self.redis)
        reply = cluster.cluster_slots(target_nodes=RedisCluster.DEFAULT_NODE)
        topology = sorted((int(start), int(end), _name(owner))
                          for (start, end), owner in _slot_ranges(reply))
        before, self._topology = self._topology, topology
        if before is None or before == topology:
            return False
        cluster.nodes_manager.initialize()
        return True


def _slot_ranges(reply: Any) -> list:
    """((start, end), master) of redis-py's parsed CLUSTER SLOTS."""
    if isinstance(reply, dict):
        return [(r, v.get("primary")) for r, v in reply.items()]
    return [((r[0], r[1]), r[2]) for r in reply]


def _name(owner: Any) -> str:
    """A master as redis-py's parsed CLUSTER SLOTS names it: (host, port)."""
    return ":".join(str(x) for x in owner[:2]) if isinstance(owner, (list, tuple)) \
        else str(owner)
