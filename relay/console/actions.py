"""The console's actions, each a POST of a form with its CSRF token: pause, unpause,
empty and delete a topic or channel, create a channel (from latest or earliest),
replay a channel, redrive its dead letters (some or all), set or remove its delivery
rate limit. Each is refused unless the
console writes (--console-write) and the user's grants allow it on that topic or
channel, and each asks for a confirmation first. What holds more than INLINE_LIMIT
messages runs as an rq job, whose page shows its progress, as relay-admin runs it.
"""

from typing import Callable, NamedTuple

from flask import Blueprint, flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from relay.admin.steering import INLINE_LIMIT, held_messages
from relay.admin.text import rate_text, summary, utc
from relay.codec import is_valid_name
from relay.console.app import Problem, console
from relay.console.pages import existing
from relay.options import parse_duration, parse_time
from relay.store import deadletter
from relay.store.history import ReplayRefused
from relay.store.limits import BadRate, OldBrokers, parse_rate
from workers import operations

bp = Blueprint("actions", __name__)

MOST_IDS = 1000


class Action(NamedTuple):
    """`channel`: True needs one, False takes none, None either; `ask`: the question
    confirming it, from its target's name ("": none); `run(topic, channel)`: where to go next."""
    channel: bool | None
    ask: str
    run: Callable[[str, str], Response]


@bp.post("/actions/<name>")
def act(name: str):
    action = ACTIONS.get(name)
    if action is None:
        raise Problem(404, f"no action {name!r}")
    if not console().write:
        raise Problem(403, "this console is read-only: start it with --console-write to "
                           "change anything")
    topic, channel = request.form.get("topic", ""), request.form.get("channel", "")
    if action.channel and not channel:
        raise Problem(400, f"{name} needs a channel")
    if action.channel is False and channel:
        raise Problem(400, f"{name} is a topic's: no channel")
    if name == "create":
        existing(topic)
    else:
        existing(topic, channel or None)
    if not console().allows(topic, channel):
        raise Problem(403, f"your grants do not allow changing "
                           f"{target(topic, channel)}")
    if action.ask and request.form.get("confirmed") != "yes":
        return render_template("confirm.html", name=name,
                               question=action.ask.format(target=target(topic, channel)),
                               fields={k: v for k, v in request.form.items(multi=True)
                                       if k not in ("csrf_token", "confirmed")},
                               ids=request.form.getlist("id"),
                               cancel=back(topic, channel).location)
    return action.run(topic, channel)


def pause(topic: str, channel: str, paused: bool = True) -> Response:
    store = console().store
    if channel:
        store.control.pause_channel(topic, channel, paused)
    else:
        store.control.pause_topic(topic, paused)
    flash(f"{'paused' if paused else 'unpaused'} {target(topic, channel)}")
    return back(topic, channel)


def drop(operation: str) -> Callable[[str, str], Response]:
    def run(topic: str, channel: str) -> Response:
        size = held_messages(console().store, topic, channel)
        if operation == "empty":
            then = back(topic, channel)
        else:       # what is deleted has no page left: its topic's, or the overview
            then = back(topic, "") if channel else redirect(url_for("pages.overview"))
        return operate(operation, topic, channel, size, None, then)
    return run


def redrive(topic: str, channel: str) -> Response:
    store = console().store
    ids = request.form.getlist("id")
    if request.form.get("all") == "yes":
        size = sum(1 for _ in deadletter.letters(store, topic, channel))
        return operate("redrive", topic, channel, size, None,
                       redirect(url_for("pages.dead_letters", topic=topic, channel=channel)))
    if not ids:
        raise Problem(400, "choose the dead letters to redrive, or redrive all")
    if len(ids) > MOST_IDS:
        raise Problem(400, f"at most {MOST_IDS} dead letters at a time: redrive all instead")
    done = deadletter.redrive_ids(store, topic, channel, set(ids))
    flash(f"redrove {done} dead letter{'s' * (done != 1)} to {topic}/{channel}"
          + (f" ({len(ids) - done} were gone already)" if done < len(ids) else ""))
    return redirect(url_for("pages.dead_letters", topic=topic, channel=channel))


def replay(topic: str, channel: str) -> Response:
    since, from_time = (request.form.get(k, "").strip() for k in ("since", "from_time"))
    if bool(since) == bool(from_time):
        raise Problem(400, "give how long ago (since, e.g. 2h) or a time (ISO 8601), "
                           "not both")
    try:
        from_ms = (console().store.now_ms() - parse_duration(since)) if since \
            else parse_time(from_time)
    except ValueError as e:
        raise Problem(400, str(e)) from None
    try:
        plan = console().store.history.plan_replay(topic, from_ms, None, None)
    except ReplayRefused as refused:
        raise Problem(400, str(refused)) from None
    if plan.clipped:
        flash(f"topic {topic} retains messages from {utc(plan.oldest_ms)} on: replayed "
              f"from there")
    return operate("replay", topic, channel, plan.size, plan.params, back(topic, channel))


def rate(topic: str, channel: str) -> Response:
    """The channel's delivery rate limit set (N/s, N/m, N/h, with a burst) or removed (off),
    as relay-admin limit --rate."""
    text, burst = (request.form.get(k, "").strip() for k in ("rate", "burst"))
    try:
        new = parse_rate(text or "off", int(burst) if burst else None)
    except (BadRate, ValueError) as bad:
        raise Problem(400, str(bad)) from None
    try:
        console().store.limits.set_rate(topic, channel, new)
    except OldBrokers as refused:
        raise Problem(409, str(refused)) from None
    flash(f"{topic}/{channel}: " + (f"at most {rate_text(new.per_s)}, bursts of {new.burst}"
                                    if new else "no rate limit"))
    return back(topic, channel)


def create(topic: str, _: str) -> Response:
    """A new channel, starting at what is published next or with all the topic retains."""
    store = console().store
    channel = request.form.get("name", "").strip()
    if not is_valid_name(channel):
        raise Problem(400, f"invalid channel name {channel!r}: 1-64 of a-z A-Z 0-9 . _ - "
                           f"(and #ephemeral at the end)")
    if request.form.get("start") != "earliest":
        created = store.control.create_channel(topic, channel)
        flash(f"created {topic}/{channel}" if created else f"{topic}/{channel} exists already")
        return back(topic, channel)
    plan = store.history.create_from_start(topic, channel)
    if plan is None:
        raise Problem(400, f"channel {topic}/{channel} exists already: from earliest makes "
                           f"a new one (replay rewinds one)")
    return operate("replay", topic, channel, plan.size, plan.params, back(topic, channel))


def operate(operation: str, topic: str, channel: str, size: int, params: dict | None,
            then: Response) -> Response:
    """Run it here when small, else queue it as an rq job and show the job's page."""
    store = console().store
    if size <= INLINE_LIMIT:
        flash(summary(operations.run(store, operation, topic, channel, params=params)))
        return then
    job = operations.enqueue(store.redis, operation, topic, channel, store.replication(),
                             params)
    return redirect(url_for("pages.job", job_id=job.id))


def back(topic: str, channel: str) -> Response:
    return redirect(url_for("pages.channel", topic=topic, channel=channel) if channel
                    else url_for("pages.topic", topic=topic))


def target(topic: str, channel: str) -> str:
    return f"{topic}/{channel}" if channel else topic


ACTIONS = {
    "pause": Action(None, "Pause {target}?", pause),
    "unpause": Action(None, "Unpause {target}?", lambda t, c: pause(t, c, False)),
    "empty": Action(None, "Empty {target}? Every message it holds is dropped.", drop("empty")),
    "delete": Action(None, "Delete {target} and every message it holds?", drop("delete")),
    "redrive": Action(True, "Queue dead letters on {target} again?", redrive),
    "replay": Action(True, "Replay the retained messages into {target}?", replay),
    "create": Action(False, "", create),
    "rate": Action(True, "", rate),
}
