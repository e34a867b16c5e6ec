"""The in-flight layout as Python reads it (scripts/lib/inflight.lua writes it): a message
in flight is the member "<id> <owner>" of its channel's inflight ZSET, scored by its
deadline, and its record in the msgs hash; since data layout 4 what one deliver call
handed one client may be a lot: one member "<lot> <owner>", the records in the msgs field
<lot> and a done flag per message in <lot>+. A broker names a message of a lot by its
item (lot_item) in FIN, REQ and TOUCH; the lot's name comes with the deliver reply
(Delivered.lot).
"""

from typing import Any, Sequence

from relay.codec import MSG_ID_LENGTH, record_id
from relay.store.runner import guarded

LOT_MAX = 4096      # messages in one lot; a bigger delivery goes in flight one by one
NOT_DONE = 0x30     # a done flag: b"0" in flight, b"1" finished


def member(msg_id: bytes, owner: str) -> bytes:
    return msg_id + b" " + owner.encode()


def member_id(member: bytes) -> bytes:
    """The id a member names (a lot's name for a lot; an item's id for an item's)."""
    return member[:MSG_ID_LENGTH]


def member_owner(member: bytes) -> str:
    """The owner a member names."""
    return member.partition(b" ")[2].decode()


def member_item(member: bytes) -> bytes:
    """What a member names, as FIN, REQ and TOUCH take it: an id, or a lot item."""
    return member.partition(b" ")[0]


def is_lot(member: bytes) -> bool:
    return member[MSG_ID_LENGTH - 1] > ord("f")


# each index of a lot (from 0) in two characters from "0" (read by lib/finish.lua's marked)
INDEXES = tuple(bytes([48 + i // 64, 48 + i % 64]) for i in range(LOT_MAX))


def lot_item(msg_id: bytes, lot: bytes, index: int) -> bytes:
    """Message `index` (from 0) of a lot, as its FIN, REQ and TOUCH name it."""
    return msg_id + lot + INDEXES[index]


def items(ids: list[bytes], lot: bytes) -> list[bytes]:
    """How FIN, REQ and TOUCH name the messages `ids` of one group of a deliver reply
    that went in flight as `lot` (Delivered.lot; b"": one by one)."""
    if not lot:
        return ids
    return [msg_id + lot + index for msg_id, index in zip(ids, INDEXES)]


LOT_ITEM = 2 * MSG_ID_LENGTH + 2    # an id, its lot's name, its index


def fin_args(pairs: Sequence[tuple]) -> list:
    """(owner, id or lot item) pairs as finish.lua takes them: the items of one lot that
    follow each other for one owner as one pair, (owner, their lot run: the lot's name,
    each index, then each id), where they took a pair each. Redis reads an argument and
    Lua splits a string for each (lib/finish.lua): 1 µs of a message's FIN."""
    out: list = []
    run_owner, run_lot = None, b""     # b"": not a lot's
    indexes: list[bytes] = []
    ids: list[bytes] = []
    for owner, x in pairs:
        lot = x[MSG_ID_LENGTH:2 * MSG_ID_LENGTH] if len(x) == LOT_ITEM else b""
        if lot != run_lot or owner != run_owner:
            if ids:
                out += (run_owner, run_lot + b"".join(indexes) + b"".join(ids))
                indexes, ids = [], []
            run_owner, run_lot = owner, lot
        if not lot:
            out += (owner, x)
        else:
            indexes.append(x[2 * MSG_ID_LENGTH:])
            ids.append(x[:MSG_ID_LENGTH])
    if ids:
        out += (run_owner, run_lot + b"".join(indexes) + b"".join(ids))
    return out


def fin_count(xs: Sequence[bytes]) -> int:
    """The messages finish.lua's second arguments `xs` name (fin_args)."""
    return sum((len(x) - MSG_ID_LENGTH) // (2 + MSG_ID_LENGTH) if len(x) > MSG_ID_LENGTH
               else 1 for x in xs)


def lot_records(blob: bytes, done: bytes) -> list[tuple[int, bytes]]:
    """(index, record) of each message of a lot not finished yet."""
    head, _, records = blob.partition(b"\n")
    out, at = [], 0
    for index, length in enumerate(map(int, head.split())):
        if done[index] == NOT_DONE:
            out.append((index, records[at:at + length]))
        at += length
    return out


def expand(client: Any, msgs_key: str, entries: list) -> list[tuple[bytes, float, bytes | None]]:
    """(member, deadline, record or None) of each message of in-flight `entries`
    ((member, deadline) pairs of one part): a lot's messages not finished, each as the
    member "<lot item> <owner>" with its record; any other entry as it is (its record
    is the msgs field of its id)."""
    lots = [member for member, _ in entries if is_lot(member)]
    if not lots:
        return [(member, deadline, None) for member, deadline in entries]
    fields = [f for m in lots for f in (member_id(m), member_id(m) + b"+")]
    values = iter(guarded(client.hmget, msgs_key, fields))
    stored = {m: (next(values), next(values)) for m in lots}
    out: list[tuple[bytes, float, bytes | None]] = []
    for member, deadline in entries:
        blob, done = stored.get(member, (None, None))
        if not is_lot(member):
            out.append((member, deadline, None))
        elif blob is not None and done is not None:
            lot, owner = member_id(member), member.partition(b" ")[2]
            out += [(lot_item(record_id(r), lot, i) + b" " + owner, deadline, r)
                    for i, r in lot_records(blob, done)]
    return out
