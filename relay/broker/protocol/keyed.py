"""Publish keys over TCP (relay/store/dedup.py), for clients that opt in with IDENTIFY
`relay_dedup: true`: `PUB <topic> <key>`, `DPUB <topic> <defer> <key>` and
`MPUB <topic> keyed` (each message "KEY BODY"). The reply is OK when every message was
published, else "OK DUPLICATES <n>". Any other client's extra parameters are ignored,
as nsqd ignores them."""

from relay.errors import FatalClientError
from relay.store.dedup import BadKeyedMessage, key_problem, keyed_messages

KEYED_MPUB = b"keyed"


def param_key(dedup: bool, params: list[bytes], position: int, command: str
              ) -> list[bytes] | None:
    """[the key] of a PUB or DPUB whose parameter `position` has one, from a client that
    opted in; else None (a plain publish)."""
    if not dedup or len(params) <= position:
        return None
    problem = key_problem(params[position])
    if problem:
        raise FatalClientError("E_INVALID", f"{command} invalid key: {problem}")
    return [params[position]]


def split_keyed(dedup: bool, params: list[bytes], messages: list[bytes]
                ) -> tuple[list[bytes], list[bytes] | None]:
    """(bodies, keys or None) of an MPUB: keyed when a client that opted in says so."""
    if not dedup or len(params) < 3:
        return messages, None
    if params[2] != KEYED_MPUB:
        raise FatalClientError("E_INVALID", "MPUB third parameter must be 'keyed'")
    try:
        bodies, keys = keyed_messages(messages)
    except BadKeyedMessage as e:
        raise FatalClientError("E_BAD_BODY", f"MPUB message {e.number}: {e.code}") from None
    return bodies, keys


def published_reply(duplicates: int) -> bytes:
    return b"OK" if not duplicates else b"OK DUPLICATES %d" % duplicates
