"""One error hierarchy; client errors carry their NSQ wire code (nsq internal/protocol/errors.go)."""


class RelayError(Exception):
    """Root of every error relay raises on purpose."""


class ClientError(RelayError):
    """An error reported to the client as an error frame; the connection stays open."""

    fatal = False

    def __init__(self, code: str, desc: str = ""):
        super().__init__(code, desc)
        self.code = code
        self.desc = desc

    def wire(self) -> bytes:
        """The error frame payload: `CODE description`."""
        text = f"{self.code} {self.desc}" if self.desc else self.code
        return text.encode("utf-8", "surrogateescape")

    def __str__(self) -> str:
        return self.wire().decode("utf-8", "replace")


class FatalClientError(ClientError):
    """An error frame after which the connection is closed."""

    fatal = True


class StoreError(RelayError):
    """Redis answered, but not as the scripts expect."""


class StoreConnectionError(StoreError):
    """Redis could not be reached in time."""


class OutcomeUnknown(StoreError):
    """A write Redis may have done all the same (sent and not answered, not confirmed by
    enough replicas, done in part): a publish retried then may be stored twice."""


class NoAnswer(StoreConnectionError, OutcomeUnknown):
    """Sent to Redis, and the connection was lost or timed out before the answer."""


def publish_outcome(error: StoreError) -> str:
    """A failed publish's outcome as told to its client: `failed: why`, or, where Redis
    may have stored it, that it may have been published."""
    if isinstance(error, OutcomeUnknown):
        return f"outcome unknown, it may have been published: {error}"
    return f"failed: {error}"


class Disconnect(RelayError):
    """The client went away or sent something unreadable: close without a frame."""


class ConfigError(RelayError):
    """Bad configuration; stops the process with one line."""


class ServerTooOld(ConfigError):
    """The Redis server lacks functions (FUNCTION, FCALL: Redis 7.0+, Valkey 7.2+), which
    relay's scripts are loaded as."""
