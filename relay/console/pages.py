"""The console's pages, which change nothing: the overview, a topic, a channel (both
live ones also as the fragment their script fetches every two seconds), its dead
letters, a peek at its next messages, where a message is, rq jobs, and the login."""

from flask import Blueprint, redirect, render_template, request, session, url_for
from rq.job import Job

from relay.admin.finding import ID, STATES, place, published
from relay.broker import registry
from relay.codec import is_valid_name
from relay.console.app import Problem, console
from relay.store import lookup
from workers import operations

bp = Blueprint("pages", __name__)

PEEKS = ("queued", "deferred", "waiting")
MOST_SHOWN = 1000


@bp.get("/")
def overview():
    return render_template("overview.html", **console().figures.overview())


@bp.get("/live/overview")
def overview_live():
    """The fragment, rendered once per read of the figures for every page polling it."""
    data = console().figures.overview()
    last = console().rendered
    if last is None or last[0] is not data:
        last = console().rendered = (data, render_template("_overview.html", **data))
    return last[1]


@bp.get("/topics/<topic>")
def topic(topic: str):
    existing(topic)
    return render_template("topic.html", **console().figures.topic(topic))


@bp.get("/topics/<topic>/<channel>")
def channel(topic: str, channel: str):
    existing(topic, channel)
    return render_template("channel.html", **console().figures.channel(topic, channel))


@bp.get("/live/topics/<topic>/<channel>")
def channel_live(topic: str, channel: str):
    existing(topic, channel)
    return render_template("_channel.html", **console().figures.channel(topic, channel))


@bp.get("/topics/<topic>/<channel>/dead")
def dead_letters(topic: str, channel: str):
    existing(topic, channel)
    limit = count_arg("n", 100)
    letters, total = console().figures.dead_letters(topic, channel, limit)
    return render_template("dead.html", topic=topic, channel=channel, letters=letters,
                           total=total)


@bp.get("/topics/<topic>/<channel>/peek")
def peek(topic: str, channel: str):
    """The next queued (or deferred, or waiting behind their keys) messages."""
    existing(topic, channel)
    store, limit = console().store, count_arg("n", 20)
    what = request.args.get("what", "queued")
    if what not in PEEKS:
        raise Problem(400, f"what= is one of {', '.join(PEEKS)}")
    reader = {"queued": lookup.queued, "deferred": lookup.deferred,
              "waiting": lookup.waiting}[what]
    rows = reader(store, topic, channel, limit)[:limit]
    keyed = what == "waiting" or store.ordering.is_ordered(topic, channel)
    if keyed and what != "waiting":
        rows = lookup.with_keys(store, topic, channel, rows)
    return render_template("peek.html", topic=topic, channel=channel, what=what, rows=rows,
                           keyed=keyed, limit=limit)


@bp.get("/find")
def find():
    """Where a message is in every channel of its topic (relay-admin msg)."""
    topic, msg_id = request.args.get("topic", "").strip(), request.args.get("id", "").strip()
    if not topic and not msg_id:
        return render_template("find.html", found=None, topic="", msg_id="")
    store = console().store
    existing(topic)
    msg_id = msg_id.lower()
    if not ID.fullmatch(msg_id):
        raise Problem(400, f"invalid message id {msg_id!r}: 16 hex digits")
    if not published(store, topic, msg_id.encode()):
        raise Problem(404, f"message {msg_id} was never published on {topic}")
    clients = {c["owner"]: c for c in registry.live_clients(
        store.redis, registry.live_brokers(store.redis))}
    places = {c: place(store, topic, c, msg_id, clients) for c in store.reads.channel_names(topic)}
    body = next((p["body"] for p in places.values() if "body" in p), None)
    return render_template("find.html", found=places, body=body, topic=topic,
                           msg_id=msg_id, states=STATES)


@bp.get("/jobs")
def jobs():
    return render_template("jobs.html", jobs=operations.all_jobs(console().store.redis)[::-1])


@bp.get("/jobs/<job_id>")
def job(job_id: str):
    return render_template("job.html", job=fetch_job(job_id),
                           workers=operations.worker_count(console().store.redis))


@bp.get("/live/jobs/<job_id>")
def job_live(job_id: str):
    return render_template("_job.html", job=fetch_job(job_id),
                           workers=operations.worker_count(console().store.redis))


@bp.route("/login", methods=["GET", "POST"])
def login():
    users = console().users
    if not users.enabled:
        return redirect(url_for("pages.overview"))
    if request.method == "GET":
        return render_template("login.html", failed=False)
    who = users.known(request.form.get("secret", ""))
    if who is None:
        return render_template("login.html", failed=True), 401
    session.clear()
    session.permanent = True
    grant = users.grant(who)
    session.update(who=who, name=(grant.identity if grant else "") or who[:8])
    target = request.args.get("next", "")
    return redirect(target if target.startswith("/") and not target.startswith("//")
                    else url_for("pages.overview"))


@bp.post("/logout")
def logout():
    session.clear()
    return redirect(url_for("pages.login") if console().users.enabled
                    else url_for("pages.overview"))


def existing(topic: str, channel: str | None = None) -> None:
    """Problem 404 unless the topic (and channel) exist."""
    store = console().store
    if not is_valid_name(topic) or topic not in store.reads.topic_names():
        raise Problem(404, f"no topic {topic!r}")
    if channel is not None and (not is_valid_name(channel)
                                or channel not in store.reads.channel_names(topic)):
        raise Problem(404, f"no channel {channel!r} in topic {topic!r}")


def count_arg(name: str, default: int) -> int:
    value = request.args.get(name, str(default))
    if not value.isdigit() or not 1 <= int(value) <= MOST_SHOWN:
        raise Problem(400, f"{name}= is a count from 1 to {MOST_SHOWN}")
    return int(value)


def fetch_job(job_id: str) -> Job:
    found = operations.find_job(console().store.redis, job_id)
    if found is None:
        raise Problem(404, f"no job {job_id!r} (finished jobs are kept 7 days)")
    return found
