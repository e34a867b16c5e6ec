"""/metrics in the Prometheus text format (prometheus-client).

Queue figures are read from Redis at scrape time, so every broker reports the same
topic and channel values; counters of this broker (publishes, deliveries, Redis
round trips) are its own, so sum them across brokers.
"""

import time

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from relay.broker.context import BrokerContext
from relay.sockio import Turns
from relay.store import stats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self, broker: BrokerContext):
        self.registry = CollectorRegistry()
        # plain counts, added to by one greenlet at a time and read at scrape time: a
        # prometheus Counter takes a lock per inc (1% of the broker's CPU per PUB)
        self.published = 0      # messages published through this broker
        self.delivered = 0      # messages this broker sent to its consumers
        self.registry.register(_BrokerCounters(self))
        self.redis_round_trip = Histogram(
            "relay_redis_round_trip_seconds", "Time of one group-commit pipeline to Redis",
            buckets=(.0005, .001, .002, .005, .01, .02, .05, .1, .5, 1),
            registry=self.registry)
        self.registry.register(_QueueCollector(broker))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _BrokerCounters:
    """This broker's own message counters."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        published = CounterMetricFamily("relay_published_messages", "Messages published "
                                        "through this broker (PUB, MPUB, DPUB, HTTP)",
                                        value=self.metrics.published)
        delivered = CounterMetricFamily("relay_delivered_messages", "Messages this broker "
                                        "sent to its consumers", value=self.metrics.delivered)
        return [published, delivered]


class _QueueCollector:
    """Topic and channel figures from Redis, clients and uptime of this broker."""

    def __init__(self, broker: BrokerContext):
        self.broker = broker
        self.started = time.time()

    def collect(self):
        data = stats.collect(self.broker.store)
        gauges = {name: GaugeMetricFamily(f"relay_{name}", help, labels=labels) for
                  name, help, labels in [
                      ("topic_depth", "Messages waiting in the topic backlog", ["topic"]),
                      ("topic_paused", "1 if the topic is paused", ["topic"]),
                      ("topic_retained_messages", "Messages the topic retains for replay "
                       "(topics with retention on)", ["topic"]),
                      ("topic_retained_bytes", "Bytes of the records the topic retains "
                       "(topics with retention on)", ["topic"]),
                      ("topic_retained_oldest_timestamp_seconds", "Publish time of the "
                       "oldest message retained (topics retaining one)", ["topic"]),
                      ("channel_depth", "Ready messages (with those waiting behind their "
                       "order key's)", ["topic", "channel"]),
                      ("channel_in_flight", "Messages in flight", ["topic", "channel"]),
                      ("channel_deferred", "Deferred messages", ["topic", "channel"]),
                      ("channel_paused", "1 if the channel is paused", ["topic", "channel"]),
                      ("channel_consumers", "Consumers on all brokers", ["topic", "channel"]),
                      ("channel_ordered", "1 if the channel delivers in order by key "
                       "(relay-admin order)", ["topic", "channel"]),
                      ("channel_order_keys_out", "Order keys with a message out: queued, "
                       "in flight or deferred (ordered channels)", ["topic", "channel"]),
                      ("channel_order_waiting", "Messages waiting behind their order key's "
                       "(ordered channels; counted in the depth too)", ["topic", "channel"]),
                      ("channel_rate_limit", "Messages a second the channel delivers at most "
                       "(channels with a rate limit: relay-admin limit --rate)",
                       ["topic", "channel"])]}
        counters = {name: CounterMetricFamily(f"relay_{name}", help, labels=labels) for
                    name, help, labels in [
                        ("topic_messages", "Messages published to the topic", ["topic"]),
                        ("channel_messages", "Messages put in the channel",
                         ["topic", "channel"]),
                        ("channel_requeued", "REQs", ["topic", "channel"]),
                        ("channel_timed_out", "Messages requeued after their timeout",
                         ["topic", "channel"]),
                        ("channel_deleted", "Messages taken out by relay-admin msg --delete",
                         ["topic", "channel"]),
                        ("channel_expired", "Messages older than the channel's TTL when "
                         "they would have been delivered (dead-lettered or dropped)",
                         ["topic", "channel"]),
                        ("channel_overflowed", "Messages a depth limit dropped or "
                         "dead-lettered (relay-admin limit)", ["topic", "channel"])]}
        turns = Turns()
        for t in data["topics"]:
            name = [t["topic_name"]]
            gauges["topic_depth"].add_metric(name, t["depth"])
            gauges["topic_paused"].add_metric(name, int(t["paused"]))
            counters["topic_messages"].add_metric(name, t["message_count"])
            if "retention" in t:
                _add_retained(gauges, name, t["retention"])
            for c in t["channels"]:
                turns.take()
                labels = name + [c["channel_name"]]
                for metric, field in [("channel_depth", "depth"),
                                      ("channel_in_flight", "in_flight_count"),
                                      ("channel_deferred", "deferred_count"),
                                      ("channel_paused", "paused"),
                                      ("channel_consumers", "client_count"),
                                      ("channel_ordered", "ordered")]:
                    gauges[metric].add_metric(labels, int(c[field]))
                if c["ordered"]:
                    gauges["channel_order_keys_out"].add_metric(labels, c["order_keys_out"])
                    gauges["channel_order_waiting"].add_metric(labels, c["order_waiting"])
                if c["rate_limit"] is not None:
                    gauges["channel_rate_limit"].add_metric(labels, c["rate_limit"])
                for metric, field in [("channel_messages", "message_count"),
                                      ("channel_requeued", "requeue_count"),
                                      ("channel_timed_out", "timeout_count"),
                                      ("channel_deleted", "deleted_count"),
                                      ("channel_expired", "expired_count"),
                                      ("channel_overflowed", "overflow_count")]:
                    counters[metric].add_metric(labels, c[field])
        for family in [*gauges.values(), *counters.values()]:
            family.samples = TurnTaking(family.samples)
            yield family
        calls = CounterMetricFamily(
            "relay_redis_script_calls", "Script calls this broker's group commit sent to "
            "Redis, by script (publishes, FINs, REQs and TOUCHes merged into one call count "
            "once)", labels=["script"])
        for script, count in sorted(self.broker.commit.calls.items()):
            calls.add_metric([script], count)
        yield calls
        yield GaugeMetricFamily("relay_clients", "TCP clients connected to this broker",
                                value=len(self.broker.clients))
        yield GaugeMetricFamily("relay_uptime_seconds", "Seconds since this broker started",
                                value=time.time() - self.started)


class TurnTaking(list):
    """A family's samples that give the broker's other greenlets turns while
    generate_latest formats them: at 5,000 channels its 75,000 lines took 1.3 s in one
    go, and a PUB beside 4 /metrics pollers waited 1.36 s."""

    def __iter__(self):
        turns = Turns()
        for sample in list.__iter__(self):
            turns.take()
            yield sample


def _add_retained(gauges: dict, name: list, retention: dict) -> None:
    """A topic's retained figures; the oldest's time only when it retains one."""
    gauges["topic_retained_messages"].add_metric(name, retention["retained"])
    gauges["topic_retained_bytes"].add_metric(name, retention["bytes"])
    if retention["oldest_ms"] is not None:
        gauges["topic_retained_oldest_timestamp_seconds"].add_metric(
            name, retention["oldest_ms"] / 1000)
