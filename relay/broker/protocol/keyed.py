"""Publish keys (relay/store/dedup.py) and order keys (relay/store/ordering.py) over TCP,
for clients that opt in with IDENTIFY `relay_dedup: true`, `relay_order: true` or both:
`PUB <topic> [<publish key>] [<order key>]` and `DPUB <topic> <defer> [<publish key>]
[<order key>]`, each given where the client opted into it; `MPUB <topic> keyed` (each
message "KEY BODY"), `MPUB <topic> ordered` ("ORDERKEY BODY") or `MPUB <topic>
keyed+ordered` ("KEY ORDERKEY BODY"). The reply is OK when every message was published,
else "OK DUPLICATES <n>". Any other client's extra parameters are ignored, as nsqd
ignores them."""

from typing import Protocol

from relay.errors import FatalClientError
from relay.store.dedup import BadKeyedMessage, key_problem
from relay.store.ordering import order_key_problem, split_keyed_forms

MPUB_FORMS = {b"keyed": (True, False), b"ordered": (False, True),
              b"keyed+ordered": (True, True)}


class OptedIn(Protocol):
    dedup: bool     # IDENTIFY relay_dedup
    order: bool     # IDENTIFY relay_order


def param_keys(client: OptedIn, params: list[bytes], position: int, command: str
               ) -> "tuple[list[bytes] | None, list[bytes | None] | None]":
    """([the publish key] or None, [the order key] or None) of a PUB or DPUB whose
    optional parameters start at `position`, from what the client opted into."""
    publish_keys: list[bytes] | None = None
    order_keys: "list[bytes | None] | None" = None
    if client.dedup and len(params) > position:
        problem = key_problem(params[position])
        if problem:
            raise FatalClientError("E_INVALID", f"{command} invalid key: {problem}")
        publish_keys = [params[position]]
        position += 1
    if client.order and len(params) > position:
        problem = order_key_problem(params[position])
        if problem:
            raise FatalClientError("E_INVALID", f"{command} invalid order key: {problem}")
        order_keys = [params[position]]
    return publish_keys, order_keys


def split_keyed(client: OptedIn, params: list[bytes], messages: list[bytes]
                ) -> "tuple[list[bytes], list[bytes] | None, list[bytes | None] | None]":
    """(bodies, publish keys or None, order keys or None) of an MPUB, in the form its
    third parameter names, if the client opted into what that form carries."""
    if not (client.dedup or client.order) or len(params) < 3:
        return messages, None, None
    form = MPUB_FORMS.get(params[2])
    if form is None or (form[0] and not client.dedup) or (form[1] and not client.order):
        allowed = [name.decode() for name, (ids, keys) in MPUB_FORMS.items()
                   if (client.dedup or not ids) and (client.order or not keys)]
        raise FatalClientError("E_INVALID",
                               f"MPUB third parameter must be {' or '.join(map(repr, allowed))}")
    try:
        bodies, publish_keys, order_keys = split_keyed_forms(messages, *form)
    except BadKeyedMessage as e:
        raise FatalClientError("E_BAD_BODY", f"MPUB message {e.number}: {e.code}") from None
    return bodies, publish_keys, order_keys


def published_reply(duplicates: int) -> bytes:
    return b"OK" if not duplicates else b"OK DUPLICATES %d" % duplicates
