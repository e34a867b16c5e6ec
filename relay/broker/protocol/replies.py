"""What a command handler returns besides bytes and None (protocol/v2.py): a Pending
publish, the Settled FINs, REQs and TOUCHes of one command, and an Upgrade of the
connection after IDENTIFY's reply (TLS, snappy, deflate)."""

from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

from gevent.event import AsyncResult

from relay.codec import as_text
from relay.errors import ClientError, StoreConnectionError, StoreError
from relay.store.codes import NOT_IN_FLIGHT, NOT_OWNER

if TYPE_CHECKING:
    from relay.store.commit import Submitted


class Pending:
    """A reply that waits for Redis: `finish(value, error)` makes it bytes/None or raises
    ClientError, which `resolve()` passes on."""

    __slots__ = ("result", "finish")

    def __init__(self, result: "Submitted",
                 finish: Callable[[Any, StoreError | None], bytes | None]) -> None:
        self.result = result
        self.finish = finish

    def when_ready(self, callback: Callable[[Any], None]) -> bool:
        """callback(result) from the hub once resolve() would not wait; False if the
        result cannot say (a keyed publish's several calls): wait for it."""
        if not isinstance(self.result, AsyncResult):
            return False
        self.result.rawlink(callback)
        return True

    def resolve(self) -> bytes | None:
        try:
            value = self.result.get()
        except StoreError as e:
            return self.finish(None, e)
        return self.finish(value, None)


class Settled:
    """The reply to FIN, REQ or TOUCH commands sent to Redis as one call per part of
    the topic their ids name: nothing for each that took (nsqd sends none), a non-fatal
    E_<COMMAND>_FAILED for each that did not, in the commands' order. `took(ids)` is
    told the ids that took, once Redis has answered."""

    __slots__ = ("calls", "command", "ids", "took")

    def __init__(self, calls: "list[tuple[Submitted, Sequence[int]]]", command: str,
                 ids: list[bytes], took: Callable[[list[bytes]], None]) -> None:
        """`calls`: each call's result, and the positions in `ids` of its ids."""
        self.calls = calls
        self.command = command
        self.ids = ids
        self.took = took

    def when_ready(self, callback: Callable[[Any], None]) -> bool:
        """callback(result) from the hub once errors() would not wait, as
        Pending.when_ready."""
        results = [result for result, _ in self.calls if isinstance(result, AsyncResult)]
        if len(results) < len(self.calls):
            return False
        if len(results) == 1:
            results[0].rawlink(callback)
            return True
        left = [len(results)]

        def one(result: Any) -> None:
            left[0] -= 1
            if left[0] == 0:
                callback(result)
        for result in results:
            result.rawlink(one)
        return True

    def errors(self) -> list[ClientError]:
        codes: list = [None] * len(self.ids)
        for result, where in self.calls:
            try:
                for i, code in zip(where, result.get()):
                    codes[i] = code
            except StoreConnectionError:
                pass
            except StoreError as e:     # refused: its cause
                for i in where:
                    codes[i] = e
        done, errors = [], []
        for msg_id, code in zip(self.ids, codes):
            reason = str(code) if isinstance(code, StoreError) else SETTLE_FAILURES.get(code)
            if reason is None:
                done.append(msg_id)
            else:
                errors.append(ClientError(f"E_{self.command}_FAILED",
                                          f"{self.command} {as_text(msg_id)} failed {reason}"))
        self.took(done)
        return errors


# a FIN, REQ or TOUCH's code from Redis (None: no answer) -> why it failed; a call Redis
# refused fails with its cause (relay/store/causes.py)
SETTLE_FAILURES = {None: "redis unavailable", NOT_IN_FLIGHT: "ID not in flight",
                   NOT_OWNER: "client does not own message"}


class Upgrade:
    """IDENTIFY's response when it negotiated TLS or compression: the writer sends it,
    runs the steps, and tells the reader whether the connection may go on."""

    def __init__(self, response: bytes, steps: list[Callable[[], None]]) -> None:
        self.response = response
        self.steps = steps
        self._done: AsyncResult[bool] = AsyncResult()

    def finish(self, ok: bool) -> None:
        self._done.set(ok)

    def wait(self) -> bool:
        return cast(bool, self._done.get())    # finish() sets a bool


Reply = bytes | Pending | Settled | Upgrade | None
"""A handler's reply; the queue to the writer also carries the ClientErrors they raise."""
