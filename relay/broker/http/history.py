"""relay's HTTP extensions for topics' histories (relay/store/history.py), beside nsqd's
API on the same port: the retention of a topic, the replay of a channel, and
/channel/create's from=earliest (nsqd.py hands it here). Errors are in nsqd's form:
400 MISSING_ARG_*, INVALID_ARG_*, NO_HISTORY, NOT_RETAINED; 404 TOPIC_NOT_FOUND,
CHANNEL_NOT_FOUND. A replay of up to INLINE_LIMIT messages runs in the request; a
bigger one is queued as an rq job for `relay jobs` (relay-admin jobs follows it)."""

from relay.broker.context import BrokerContext
from relay.broker.http.server import (HttpError, Routes, existing_channel, existing_topic,
                                      from_store, parsed_arg)
from relay.options import parse_duration, parse_moment, parse_size
from relay.store.history import ReplayPlan, ReplayRefused, iso_ms
from workers import operations

INLINE_LIMIT = 10_000


class HistoryApi:
    """The endpoints of topics' histories of one broker."""

    def __init__(self, broker: BrokerContext):
        self.broker = broker

    def routes(self) -> Routes:
        return {"/topic/retention": {"GET": self.retention, "POST": self.retention},
                "/channel/replay": {"POST": self.replay}}

    def retention(self, request):
        """GET: the topic's retention and what it retains; POST sets it from `time`
        (a duration, e.g. 24h), `max_bytes` (e.g. 1GB) or `off=true`."""
        topic = existing_topic(self.broker, request.topic())
        if request.method == "POST":
            off = request.arg("off") in ("true", "1")
            time_ms = parsed_arg(request, "time", parse_duration, "INVALID_ARG_TIME")
            max_bytes = parsed_arg(request, "max_bytes", parse_size, "INVALID_ARG_MAX_BYTES")
            if not off and not (time_ms or max_bytes):
                raise HttpError(400, "MISSING_ARG_TIME")
            from_store(self.broker, lambda s: s.history.set_retention(
                topic, 0 if off else time_ms, 0 if off else max_bytes))
        return from_store(self.broker, lambda s: s.history.retention_report(topic))

    def replay(self, request):
        """The retained messages from `since` (a duration), `from_time` (ISO 8601, or ms)
        or `from_id` to `to_time` (else the newest) back in the channel's queue."""
        topic, channel = request.topic_channel()
        existing_channel(self.broker, topic, channel)
        since = parsed_arg(request, "since", parse_duration, "INVALID_ARG_SINCE", None)
        from_time = parsed_arg(request, "from_time", parse_moment, "INVALID_ARG_FROM_TIME", None)
        from_id = request.arg("from_id")
        if sum(x is not None for x in (since, from_time, from_id)) != 1:
            raise HttpError(400, "MISSING_ARG_SINCE")
        if from_id is not None and (len(from_id) != 16 or from_id.strip("0123456789abcdef")):
            raise HttpError(400, "INVALID_ARG_FROM_ID")
        to_time = parsed_arg(request, "to_time", parse_moment, "INVALID_ARG_TO_TIME", None)
        try:
            plan = from_store(self.broker, lambda s: s.history.plan_replay(
                topic, s.now_ms() - since if since is not None else from_time, to_time,
                from_id))
        except ReplayRefused as refused:
            raise HttpError(400, "NOT_RETAINED" if refused.kept else "NO_HISTORY") from None
        return self.run(topic, channel, plan)

    def create_from_start(self, topic: str, channel: str):
        """/channel/create?from=earliest: a new channel with everything the topic retains."""
        plan = from_store(self.broker, lambda s: s.history.create_from_start(topic, channel))
        if plan is None:
            raise HttpError(400, "CHANNEL_EXISTS")
        return self.run(topic, channel, plan)

    def run(self, topic: str, channel: str, plan: ReplayPlan) -> dict:
        """The replay in this request, or queued as an rq job when big."""
        known = {"total": plan.size, "oldest": iso_ms(plan.oldest_ms) if plan.oldest_ms
                 else None, "clipped": plan.clipped}
        if plan.size > INLINE_LIMIT:
            job = from_store(self.broker, lambda s: operations.enqueue(
                s.redis, "replay", topic, channel, s.replication(), plan.params))
            return {"job": job.id, **known}
        result = from_store(self.broker, lambda s: operations.run(
            s, "replay", topic, channel, params=plan.params))
        return {"replayed": result["replayed"], "skipped": result["skipped"], **known}
