"""relay: an NSQ-compatible message broker whose state lives in Redis."""

__version__ = "0.1.0"
