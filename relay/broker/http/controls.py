"""relay's HTTP extensions for the controls nsqd has none of, beside nsqd's API on the
same port: a message TTL (relay/store/expiry.py), a channel's depth and delivery rate
limits (relay/store/limits.py), a topic's dedup window (relay/store/dedup.py), a channel's
ordered delivery and a topic's order key rule (relay/store/ordering.py), as relay-admin
ttl, limit, dedup, order and order-key show and set them, for tools that speak HTTP.
GET shows, POST sets (or with off=true clears) and answers what is in force then. Each
needs a topic made before (/topic/create; relay-admin dedup --window makes one), but
POST /channel/order makes its channel, as relay-admin order does.
Errors in nsqd's form: 400 MISSING_ARG_*, INVALID_ARG_*, ORDERED_AND_LIMITED (a channel
is ordered or has a depth limit, not both); 404 TOPIC_NOT_FOUND, CHANNEL_NOT_FOUND; 409
OLD_BROKERS (a rate limit while a broker of a release before them runs);
nothing is changed by a request that gets one."""

from typing import Callable

from relay.broker.context import BrokerContext
from relay.broker.http.server import (HttpError, Request, Routes, existing_channel,
                                      existing_topic, from_store, parsed_arg)
from relay.options import parse_duration
from relay.store.limits import (OVERFLOWS, BadRate, Limit, OldBrokers, OrderedAndLimited,
                                 parse_rate)
from relay.store.ordering import OrderKeyRule


class ControlsApi:
    """The endpoints of message TTLs, depth limits and dedup windows of one broker."""

    def __init__(self, broker: BrokerContext):
        self.broker = broker

    def routes(self) -> Routes:
        return {"/topic/ttl": {"GET": self.topic_ttl, "POST": self.topic_ttl},
                "/channel/ttl": {"GET": self.channel_ttl, "POST": self.channel_ttl},
                "/channel/limit": {"GET": self.limit, "POST": self.limit},
                "/topic/dedup": {"GET": self.dedup, "POST": self.dedup},
                "/channel/order": {"GET": self.order, "POST": self.order},
                "/topic/order-key": {"GET": self.order_key, "POST": self.order_key}}

    def topic_ttl(self, request: Request) -> dict:
        """The TTLs of a topic and its channels; POST sets the topic's `ttl` (a duration,
        e.g. 10m), for its channels without their own, or clears it (off=true)."""
        topic = existing_topic(self.broker, request.topic())
        return self._ttl(request, topic, None)

    def channel_ttl(self, request: Request) -> dict:
        """A channel's TTL; POST sets its own `ttl` (0: none, whatever the topic's) or
        clears it (off=true), so that it takes the topic's again."""
        topic, channel = request.topic_channel()
        existing_channel(self.broker, topic, channel)
        return self._ttl(request, topic, channel)

    def _ttl(self, request: Request, topic: str, channel: str | None) -> dict:
        if request.method == "POST":
            ttl_ms = parsed_arg(request, "ttl", _at_least(0, parse_duration),
                                "INVALID_ARG_TTL", None)
            _one_of(request, ttl_ms, "MISSING_ARG_TTL")
            from_store(self.broker, lambda s: s.expiry.set_ttl(topic, channel, ttl_ms))
        settings = from_store(self.broker, lambda s: s.expiry.ttl_settings(topic))
        return {"topic": topic, "ttl_ms": settings["ttl_ms"], "channels": [
            {"channel": name, **setting} for name, setting in settings["channels"].items()
            if channel in (None, name)]}

    def limit(self, request: Request) -> dict:
        """A channel's depth and rate limits, its depth and what overflowed; POST sets
        `max_depth` (1 or more) with `overflow` (reject, the default, drop-oldest or
        dead-letter), or removes it (off=true); or sets the delivery rate `rate` (N/s,
        N/m, N/h or N a second) with `burst`, or removes it (rate=off)."""
        topic, channel = request.topic_channel()
        existing_channel(self.broker, topic, channel)
        rate = request.arg("rate") or None
        if request.method == "POST" and rate is not None:
            burst = parsed_arg(request, "burst", _at_least(1, int), "INVALID_ARG_BURST", None)
            try:
                new_rate = parse_rate(rate, burst)
            except BadRate:
                raise HttpError(400, "INVALID_ARG_RATE") from None
            if burst is not None and new_rate is None:
                raise HttpError(400, "INVALID_ARG_BURST")
            try:
                from_store(self.broker, lambda s: s.limits.set_rate(topic, channel, new_rate))
            except OldBrokers:
                raise HttpError(409, "OLD_BROKERS") from None
        if request.method == "POST" and (rate is None or request.arg("max_depth")
                                         or request.arg("off")):
            max_depth = parsed_arg(request, "max_depth", _at_least(1, int),
                                   "INVALID_ARG_MAX_DEPTH", None)
            overflow = request.arg("overflow") or None
            if overflow is not None and overflow not in OVERFLOWS:
                raise HttpError(400, "INVALID_ARG_OVERFLOW")
            _one_of(request, max_depth, "MISSING_ARG_MAX_DEPTH")
            if max_depth is None and overflow is not None:    # off=true with an overflow
                raise HttpError(400, "INVALID_ARG_OFF")
            new = None if max_depth is None else Limit(max_depth, overflow or OVERFLOWS[0])
            _refused_if_ordered(lambda: from_store(
                self.broker, lambda s: s.limits.set_limit(topic, channel, new)))
        return from_store(self.broker, lambda s: s.limits.limit_report(topic, channel))

    def order(self, request: Request) -> dict:
        """A channel's ordered delivery, its keys out and the messages waiting behind
        them; POST turns it on (making the channel) or off (off=true: the waiting
        messages go out at once)."""
        topic, channel = request.topic_channel()
        if request.method == "POST":
            on = request.arg("off") not in ("true", "1")
            if not on:
                existing_channel(self.broker, topic, channel)
            _refused_if_ordered(lambda: from_store(
                self.broker, lambda s: s.ordering.set_ordered(topic, channel, on)))
        else:
            existing_channel(self.broker, topic, channel)
        return from_store(self.broker, lambda s: s.ordering.order_report(topic, channel))

    def order_key(self, request: Request) -> dict:
        """A topic's rule for the order key of messages published without one; POST sets
        `json_field` (the key is that field of a JSON body) or `separator` (the text
        before it), or removes it (off=true)."""
        topic = existing_topic(self.broker, request.topic())
        if request.method == "POST":
            given = [OrderKeyRule(kind, value) for kind, value in (
                ("json-field", request.arg("json_field")),
                ("separator", request.arg("separator"))) if value is not None]
            if any(not rule.value for rule in given):
                raise HttpError(400, "INVALID_ARG_ORDER_KEY")
            if len(given) > 1:
                raise HttpError(400, "INVALID_ARG_ORDER_KEY")
            _one_of(request, given[0] if given else None, "MISSING_ARG_ORDER_KEY")
            from_store(self.broker, lambda s: s.ordering.set_order_rule(topic, given[0] if given
                                                               else None))
        rule = from_store(self.broker, lambda s: s.ordering.order_rule(topic))
        return {"topic": topic,
                "order_key_rule": rule and {"kind": rule.kind, "value": rule.value}}

    def dedup(self, request: Request) -> dict:
        """A topic's dedup window and the keys each part remembers; POST sets `window`
        (a duration above 0, e.g. 10m) or turns it off (off=true)."""
        topic = existing_topic(self.broker, request.topic())
        if request.method == "POST":
            window_ms = parsed_arg(request, "window", _at_least(1, parse_duration),
                                   "INVALID_ARG_WINDOW", None)
            _one_of(request, window_ms, "MISSING_ARG_WINDOW")
            from_store(self.broker, lambda s: s.dedup.set_dedup(topic, window_ms or 0))
        return from_store(self.broker, lambda s: s.dedup.dedup_report(topic))


def _refused_if_ordered(change: Callable[[], object]) -> None:
    """change(), or 400 ORDERED_AND_LIMITED when it would make a channel both."""
    try:
        change()
    except OrderedAndLimited:
        raise HttpError(400, "ORDERED_AND_LIMITED") from None


def _one_of(request: Request, value, missing: str) -> None:
    """A POST sets a value (`value` not None) or clears it (off=true): 400 `missing`
    with neither, INVALID_ARG_OFF with both."""
    off = request.arg("off") in ("true", "1")
    if off and value is not None:
        raise HttpError(400, "INVALID_ARG_OFF")
    if not off and value is None:
        raise HttpError(400, missing)


def _at_least(least: int, parse: Callable[[str], int]) -> Callable[[str], int]:
    """`parse`, refusing (ValueError) what is below `least`."""
    def checked(raw: str) -> int:
        value = parse(raw)
        if value < least:
            raise ValueError(raw)
        return value
    return checked
