"""The in-flight layout as Python reads it (scripts/lib/inflight.lua writes it): a message
in flight is the member "<id> <owner>" of its channel's inflight ZSET, scored by its
deadline, and its record in the msgs hash.
Members of the layout before are "<id>", with "<delivered ms> <owner>" in the leases hash.
"""

from relay.codec import MSG_ID_LENGTH


def member(msg_id: bytes, owner: str) -> bytes:
    return msg_id + b" " + owner.encode()


def member_id(member: bytes) -> bytes:
    return member[:MSG_ID_LENGTH]


def member_owner(member: bytes, leases: dict[bytes, bytes]) -> str | None:
    """The owner a member names; for one of the layout before, its lease's owner in
    `leases` (None if it has none: finished meanwhile)."""
    if len(member) > MSG_ID_LENGTH:
        return member[MSG_ID_LENGTH + 1:].decode()
    lease = leases.get(member)
    return None if lease is None else lease.partition(b" ")[2].decode()
