"""The in-flight layout as Python reads it (scripts/lib/inflight.lua writes it): a message
in flight is the member "<id> <owner>" of its channel's inflight ZSET, scored by its
deadline, and its record in the msgs hash.
"""

from relay.codec import MSG_ID_LENGTH


def member(msg_id: bytes, owner: str) -> bytes:
    return msg_id + b" " + owner.encode()


def member_id(member: bytes) -> bytes:
    return member[:MSG_ID_LENGTH]


def member_owner(member: bytes) -> str:
    """The owner a member names."""
    return member[MSG_ID_LENGTH + 1:].decode()
