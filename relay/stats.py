"""Stats read from Redis, in nsqd's /stats field names (topics -> channels)."""

from relay.protocol.codec import is_ephemeral
from relay.store import Store


def collect(store: Store, topic: str | None = None, channel: str | None = None) -> dict:
    """{"topics": [...]} for every topic, or one topic / one channel of it."""
    names = [topic] if topic else store.topic_names()
    topics = []
    for name in names:
        t = store.read_topic(name)
        channels = []
        for ch in ([channel] if channel else store.channel_names(name)):
            channels.append({"channel_name": ch, "paused": False,
                             "ephemeral": is_ephemeral(ch), **store.read_channel(name, ch)})
        topics.append({"topic_name": name, "depth": t["depth"],
                       "deferred_count": t["deferred_count"],
                       "message_count": t["message_count"],
                       "message_bytes": t["message_bytes"], "paused": False,
                       "channels": channels})
    return {"topics": topics}
