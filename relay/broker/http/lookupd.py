"""nsqlookupd's HTTP API (nsqlookupd/http.go), answered from the broker registry.

Every live broker is a producer of every topic (the state is shared in Redis), so a
client given any broker as its lookupd finds all of them. The queries (/lookup,
/topics, /channels, /nodes) are also served on nsqd's port; --lookupd-http-address
serves them alone, with nsqlookupd's own /ping, /info, topic/channel registration and
tombstones.
"""

import logging

from relay.broker import registry
from relay.codec import NSQD_VERSION, is_valid_name
from relay.broker.context import BrokerContext
from relay.broker.http.server import (JSON, HttpError, HttpServer, Routes, Typed,
                                      existing_topic, from_registry, from_store, json_bytes)
from relay.broker.http.shared import SharedReads
from relay.broker.registry import live_brokers

log = logging.getLogger("relay.http")


def lookupd_server(broker: BrokerContext) -> HttpServer:
    """The server of --lookupd-http-address: nsqlookupd's API and nothing of nsqd's."""
    return HttpServer(broker, LookupdApi(broker).routes())


class LookupdApi:
    """nsqlookupd's endpoints of one broker."""

    def __init__(self, broker: BrokerContext):
        self.broker = broker
        self.shared = SharedReads()

    def queries(self) -> Routes:
        """What a consumer asks a lookupd: served on nsqd's port too."""
        return {"/lookup": {"GET": self.lookup}, "/topics": {"GET": self.topics},
                "/channels": {"GET": self.channels}, "/nodes": {"GET": self.nodes}}

    def routes(self) -> Routes:
        """Everything nsqlookupd answers, so tools pointed at a lookupd port work."""
        return {
            **self.queries(),
            "/ping": {"GET": lambda request: "OK"},
            "/info": {"GET": lambda request: {"version": NSQD_VERSION}},
            "/topic/create": {"POST": self.topic_create},
            "/topic/delete": {"POST": self.topic_delete},
            "/topic/tombstone": {"POST": self.topic_tombstone},
            "/channel/create": {"POST": self.channel_create},
            "/channel/delete": {"POST": self.channel_delete},
        }

    def lookup(self, request):
        """Every live broker but those tombstoned for the topic."""
        topic = existing_topic(self.broker, request.required("topic"))
        channels = from_store(self.broker, lambda s: s.reads.channel_names(topic))
        brokers, tombstones = from_registry(
            self.broker, lambda r: (live_brokers(r), registry.tombstoned(r, [topic])[topic]))
        return {"channels": channels,
                "producers": [_peer(b) for b in brokers if registry.node(b) not in tombstones]}

    def topics(self, request):
        return {"topics": from_store(self.broker, lambda s: s.reads.topic_names())}

    def channels(self, request):
        topic = request.required("topic")
        return {"channels": from_store(self.broker, lambda s: s.reads.channel_names(topic))}

    def nodes(self, request):
        """Every live broker, tombstoned or not, with a tombstone flag per topic: one
        read of every topic's tombstones for all the pollers asking at once."""
        return self.shared.read("nodes", self._nodes)

    def _nodes(self) -> Typed:
        topics = from_store(self.broker, lambda s: s.reads.topic_names())
        brokers, tombstones = from_registry(
            self.broker, lambda r: (live_brokers(r), registry.tombstoned(r, topics)))
        return Typed(json_bytes({"producers": [
            {**_peer(b), "topics": topics,
             "tombstones": [registry.node(b) in tombstones[t] for t in topics]}
            for b in brokers]}), JSON)

    def topic_create(self, request):
        """nsqlookupd registers the topic; a bad name is its INVALID_ARG_TOPIC."""
        topic = request.required("topic")
        if not is_valid_name(topic):
            raise HttpError(400, "INVALID_ARG_TOPIC")
        from_store(self.broker, lambda s: s.control.create_topic(topic))

    def topic_delete(self, request):
        """nsqlookupd forgets the topic and answers 200, known or not. relay's
        registrations are the topic itself, shared by every broker, so the data stays for
        the nsqd API's /topic/delete that nsqadmin sends each producer next; the first
        deletes it, and the others answer 200 as well (relay/broker/http/nsqd.py)."""
        topic = request.required("topic")
        if is_valid_name(topic):
            self._deregister(topic, "")

    def topic_tombstone(self, request):
        """Leave the broker whose HTTP address is `node` out of /lookup for the topic
        for --tombstone-lifetime; nothing is deleted, and nsqlookupd answers 200 for
        any node."""
        topic = request.required("topic")
        address = request.required("node")
        if not is_valid_name(topic):
            return      # no topic has that name: nothing to leave out
        lifetime = self.broker.options.tombstone_lifetime
        log.info("tombstoning broker %s for topic %s for %d ms", address, topic, lifetime)
        from_registry(self.broker, lambda r: registry.tombstone(r, topic, address, lifetime))

    def channel_create(self, request):
        """nsqlookupd registers the topic with its channel."""
        topic, channel = request.topic_channel()
        from_store(self.broker, lambda s: (s.control.create_topic(topic), s.control.create_channel(topic, channel)))

    def channel_delete(self, request):
        """As nsqlookupd: 404 for a channel it does not know, else 200, the data left to
        the nsqd API's /channel/delete (see topic_delete)."""
        topic, channel = request.topic_channel()
        if channel not in from_store(self.broker, lambda s: s.reads.channel_names(topic)):
            raise HttpError(404, "CHANNEL_NOT_FOUND")
        self._deregister(topic, channel)

    def _deregister(self, topic: str, channel: str) -> None:
        lifetime = self.broker.options.tombstone_lifetime
        from_registry(self.broker, lambda r: registry.deregister(r, topic, channel, lifetime))

def _peer(broker: dict) -> dict:
    """nsqlookupd's PeerInfo of a registered broker."""
    return {"remote_address": broker["remote_address"], "hostname": broker["hostname"],
            "broadcast_address": broker["broadcast_address"],
            "tcp_port": int(broker["tcp_port"]), "http_port": int(broker["http_port"]),
            "version": broker["version"]}
