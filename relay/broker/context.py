"""The type of the broker that the parts serving its clients hold."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import ssl

    from redis import Redis
    from redis.cluster import RedisCluster

    from relay.broker.auth import Authorizer
    from relay.broker.channel import Channel
    from relay.broker.client import Client
    from relay.broker.http.server import HttpServer
    from relay.store.latency import E2eLatency
    from relay.broker.metrics import Metrics
    from relay.broker.publishing import Publishing
    from relay.broker.settling import Settling
    from relay.options import Options
    from relay.store import Store
    from relay.store.commit import GroupCommit


class BrokerContext(Protocol):
    """What the protocol handlers, the channels' delivery loops, the wake-up listener,
    /metrics and the HTTP API use of the broker they serve, so a reader (and a type
    checker) can follow the data path without the broker's lifecycle.
    relay.broker.broker.Broker is the one implementation. Nothing here is imported at run
    time, so any module can name this type without an import cycle."""

    options: Options                        # replaced whole by PUT /config/log_level
    redis: Redis | RedisCluster
    store: Store
    commit: GroupCommit                     # batches the Store's ops of all connections
    publishing: Publishing                  # the one path of TCP and HTTP publishes
    settling: Settling                      # FIN, REQ and TOUCH by part
    channels: dict[tuple[str, str], Channel]    # (topic, channel) with local consumers
    topics: dict[str, dict[str, Channel]]   # the same channels, by topic and name
    holding: set[Client]                    # clients given messages: the expiry walks these
    clients: dict[int, Client]              # every connection, by number
    metrics: Metrics
    e2e: E2eLatency
    auth: Authorizer
    tls_context: ssl.SSLContext | None
    tcp_port: int
    http: HttpServer                        # the nsqd API server; /info reports its port

    @property
    def lots(self) -> bool: ...     # data layout 4 in force: deliveries go as lots

    @property
    def prioritized(self) -> bool: ...  # data layout 5 in force: messages have priorities

    def subscribe(self, client: Client, topic: str, channel_name: str) -> None: ...

    def grow(self, channel: Channel) -> None: ...   # its topic has more partitions now

    def subscribed_clients(self) -> list[Client]: ...

    def flush_latency(self) -> None: ...
