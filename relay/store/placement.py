"""Where a partitioned topic's parts go on a cluster. Masters are taken in the order of
the lowest slot each serves; part i goes to the master i places after part 0's (part 0
is the topic itself, whose slot its name fixes), so N parts use min(N, M) of M masters,
evenly. A part gets there by a salt in its name (keys.part_name): the first that puts
its slot on that master. The salts are kept with the count (partitions.lua), so every
process names the parts alike whatever slot map it reads later; when slots move, the
parts stay with their slots."""

from typing import Sequence

from relay.store import keys

SEARCH = 1 << 20    # salts tried for one part; a master of a few slots needs many


def placement(topic: str, count: int, owners: Sequence[int]) -> str:
    """The salts of parts 1 to count-1, space-separated, as partitions.lua keeps them;
    `owners` is the master (in slot order) of each slot, -1 where none serves it."""
    masters = max(owners) + 1
    first = owners[keys.part_slot(topic)]
    if masters < 2 or first < 0:
        return ""
    return " ".join(str(salt(topic, i, owners, (first + i) % masters))
                    for i in range(1, count))


def salt(topic: str, index: int, owners: Sequence[int], master: int) -> int:
    """The first salt that puts the part on `master` (0, its plain name, if none does)."""
    for s in range(SEARCH):
        if owners[keys.part_slot(keys.part_name(topic, index, s))] == master:
            return s
    return 0
