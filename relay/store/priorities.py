"""Message priorities (issue 60 part 2, data layout 5). A message's priority, 0-9 with
the higher delivered first, is its id's first digit (keys.id_priority), so it stays
with the message wherever it goes: in flight, deferred, requeued, dead-lettered,
retained for replay. A channel's ready messages of priority 1-9 wait in a list per
priority beside its queue, counted in its urgent hash: every deliver call takes them
first, the highest first and each list from its head (FIFO, a REQ to the back, as the
queue); priority 0 is the queue of any channel, so a topic without priorities stores
and moves its messages as before (scripts/lib/queue.lua).

A message gets its priority from its publisher (/pub?priority=, /mpub?priority=,
relay-admin pub --priority), or else from its topic's rule: a JSON field of the body
(`priority_rule` in part 0's version hash, read with the partition count as the order
key rule is, relay/store/ordering.py), for stock TCP clients."""

import json
from typing import Sequence

from relay.codec import MAX_PRIORITY
from relay.errors import StoreError
from relay.store.data_path import Service
from relay.store.keys import TopicKeys
from relay.store.runner import Op, guarded

RULE_FIELD = "priority_rule"


class PrioritiesRefused(ValueError):
    """Priorities need data layout 5 in force (relay-admin upgrade finish)."""


def parse_priority(text: str) -> int:
    """A priority as given: one digit 0-9; ValueError for anything else."""
    if len(text) != 1 or not "0" <= text <= str(MAX_PRIORITY):
        raise ValueError(f"a priority is a whole number 0-{MAX_PRIORITY}, not {text!r}")
    return int(text)


def priority_of(body: bytes, field: str) -> int:
    """A body's priority by a topic's rule: its JSON object's `field`, a whole number
    held to 0-9; 0 for a body without one."""
    try:
        value = json.loads(body).get(field)
    except (ValueError, AttributeError):
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        return 0
    return max(0, min(MAX_PRIORITY, int(value)))


class Priorities(Service):
    """The priorities of what is published, and the topics' rules."""

    def set_rule(self, topic: str, field: str | None) -> None:
        """The topic's JSON field for the priority of messages published without one
        (None: none); brokers use it within a second. PrioritiesRefused below data
        layout 5."""
        if field is not None:
            self.check_layout()
        t = TopicKeys.of(topic)
        self.store.run(Op("topic_rule", [t.version], [RULE_FIELD, field or "", t.wake,
                                                      self.store.node(topic)]))
        self.store.partitions(topic, fresh=True)

    def rule(self, topic: str) -> str | None:
        """The topic's priority field as set now (read from Redis)."""
        value = guarded(self.redis.hget, TopicKeys.of(topic).version, RULE_FIELD)
        return value.decode() if value else None

    def check_layout(self) -> None:
        from relay.store import layout     # layout reads dead letters: not at import
        if layout.writing(self.redis) < layout.PRIORITIES:
            raise PrioritiesRefused(
                f"message priorities need data layout {layout.PRIORITIES} in force: run "
                "`relay-admin upgrade finish` once every process is relay 0.6.0 or later")

    def of(self, topic: str, bodies: Sequence[bytes], given: int | None = None
           ) -> list[int] | None:
        """Each body's priority: `given` for all, else by the topic's rule as last read
        with its partition count; None when all are 0 (a plain publish)."""
        if given is not None:
            return [given] * len(bodies) if given else None
        if not self.store.knows(topic):
            try:
                self.store.partitions(topic)
            except StoreError:
                return None     # the publish's own call then fails or lands
        field = self.store.known_priority_rule(topic)
        if not field:
            return None
        found = [priority_of(body, field) for body in bodies]
        return found if any(found) else None
