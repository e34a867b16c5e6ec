"""nsqlookupd's HTTP API (nsqlookupd/http.go), answered from the broker registry.

Every live broker is a producer of every topic (the state is shared in Redis), so a
client given any broker as its lookupd finds all of them. The queries (/lookup,
/topics, /channels, /nodes) are also served on nsqd's port; --lookupd-http-address
serves them alone, with nsqlookupd's own /ping, /info and topic/channel registration.
"""

import logging

import redis

from relay.codec import NSQD_VERSION
from relay.context import BrokerContext
from relay.http.server import HttpError, HttpServer, Routes, existing_topic, from_store
from relay.registry import live_brokers

log = logging.getLogger("relay.http")


def lookupd_server(broker: BrokerContext) -> HttpServer:
    """The server of --lookupd-http-address: nsqlookupd's API and nothing of nsqd's."""
    return HttpServer(broker, LookupdApi(broker).routes())


class LookupdApi:
    """nsqlookupd's endpoints of one broker."""

    def __init__(self, broker: BrokerContext):
        self.broker = broker

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
            "/channel/create": {"POST": self.channel_create},
            "/channel/delete": {"POST": self.channel_delete},
        }

    def lookup(self, request):
        topic = existing_topic(self.broker, request.required("topic"))
        return {"channels": from_store(self.broker, lambda s: s.channel_names(topic)),
                "producers": [_peer(b) for b in self._brokers()]}

    def topics(self, request):
        return {"topics": from_store(self.broker, lambda s: s.topic_names())}

    def channels(self, request):
        topic = request.required("topic")
        return {"channels": from_store(self.broker, lambda s: s.channel_names(topic))}

    def nodes(self, request):
        topics = from_store(self.broker, lambda s: s.topic_names())
        return {"producers": [{**_peer(b), "tombstones": [False] * len(topics), "topics": topics}
                              for b in self._brokers()]}

    def topic_create(self, request):
        topic = request.topic()
        from_store(self.broker, lambda s: s.create_topic(topic))

    def topic_delete(self, request):
        """nsqlookupd answers 200 whether or not the topic was registered."""
        topic = request.required("topic")
        from_store(self.broker, lambda s: s.delete_topic(topic))

    def channel_create(self, request):
        """nsqlookupd registers the topic with its channel."""
        topic, channel = request.topic_channel()
        from_store(self.broker, lambda s: (s.create_topic(topic), s.create_channel(topic, channel)))

    def channel_delete(self, request):
        """Unlike nsqd, nsqlookupd does not ask for the topic first."""
        topic, channel = request.topic_channel()
        if not from_store(self.broker, lambda s: s.delete_channel(topic, channel)):
            raise HttpError(404, "CHANNEL_NOT_FOUND")

    def _brokers(self) -> list:
        try:
            return live_brokers(self.broker.redis)
        except redis.exceptions.RedisError as e:
            log.warning("http: %s", e)
            raise HttpError(500, "INTERNAL_ERROR") from None


def _peer(broker: dict) -> dict:
    """nsqlookupd's PeerInfo of a registered broker."""
    return {"remote_address": broker["remote_address"], "hostname": broker["hostname"],
            "broadcast_address": broker["broadcast_address"],
            "tcp_port": int(broker["tcp_port"]), "http_port": int(broker["http_port"]),
            "version": broker["version"]}
