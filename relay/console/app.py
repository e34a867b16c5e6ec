"""The console's Flask app: pages (pages.py) and actions (actions.py), a login with
--console-auth-file's secrets whose grants are checked per topic and channel, a CSRF
token on every form (Flask-WTF), and read-only unless --console-write.

Flask because it is a WSGI app, which the broker's strict HTTP/1.1 server (http1.py)
serves on gevent as it serves nsqd's API, and its Jinja2 templates escape all they
print; Flask-WTF for CSRF tokens tied to the session.
"""

import hashlib
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Callable

import redis
from flask import Flask, current_app, redirect, render_template, request, session, url_for
from flask_wtf.csrf import CSRFError, CSRFProtect

from relay.admin.text import duration_text, rate_text, utc
from relay.broker.auth import Grant, grant_of, load_file
from relay.codec import go_quote
from relay.console.figures import Figures
from relay.errors import StoreConnectionError, StoreError
from relay.options import Options, redacted_url
from relay.store import Store
from relay.store.causes import cause
from workers import operations

log = logging.getLogger("relay.console")

MAX_FORM_BYTES = 64 * 1024
SESSION_HOURS = 12
PREVIEW = 80
OPEN_ENDPOINTS = {"pages.login", "static"}


class Problem(Exception):
    """What the user asked cannot be done: a page with the text, and this status."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


class Users:
    """--console-auth-file: each secret's grants, the secret kept only as its SHA-256."""

    def __init__(self, path: str):
        self.grants: dict[str, Grant] | None = None
        if path:
            self.grants = {digest(s): grant_of(r) for s, r in load_file(path).items()}

    @property
    def enabled(self) -> bool:
        return self.grants is not None

    def known(self, secret: str) -> str | None:
        """The user's digest, if the secret grants anything."""
        who = digest(secret)
        grant = (self.grants or {}).get(who)
        return who if grant is not None and grant.authorizations else None

    def grant(self, who: str | None) -> Grant | None:
        return (self.grants or {}).get(who or "")


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass
class Console:
    """What the views share: the store, its figures, the users and whether it writes."""
    store: Store
    figures: Figures
    users: Users
    write: bool
    redis_url: str
    rendered: tuple[dict, str] | None = None    # the overview's figures and fragment

    def allows(self, topic: str, channel: str = "") -> bool:
        """Whether the logged-in user may change the topic (publish grant) or the
        channel (subscribe grant), as the HTTP API checks /topic/... and /channel/..."""
        if not self.users.enabled:
            return True
        grant = self.users.grant(session.get("who"))
        return grant is not None and grant.allows(topic, channel)


def console() -> Console:
    return current_app.extensions["relay.console"]


def create_app(store: Store, options: Options, clock: Callable[[], float] = time.time) -> Flask:
    from relay.console import actions, pages
    app = Flask(__name__)
    app.config.update(SECRET_KEY=secrets.token_bytes(32), MAX_CONTENT_LENGTH=MAX_FORM_BYTES,
                      SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Strict",
                      PERMANENT_SESSION_LIFETIME=SESSION_HOURS * 3600,
                      WTF_CSRF_TIME_LIMIT=SESSION_HOURS * 3600)
    app.extensions["relay.console"] = Console(store, Figures(store, clock),
                                              Users(options.console_auth_file),
                                              options.console_write, options.redis_url)
    CSRFProtect(app)
    app.register_blueprint(pages.bp)
    app.register_blueprint(actions.bp)
    app.before_request(_logged_in)
    app.after_request(_no_framing)
    app.context_processor(lambda: {"console": console(), "user": session.get("name")})
    app.jinja_env.filters.update(utc=utc, ms=duration_text, body=body_text, bytes=size_text,
                                 rate=rate_text)
    app.register_error_handler(Problem, _problem)
    app.register_error_handler(CSRFError, lambda e: _problem(Problem(
        400, "this form expired or did not come from this console (CSRF): reload the "
             "page and try again")))
    app.register_error_handler(StoreConnectionError, _unreachable)
    app.register_error_handler(redis.exceptions.ConnectionError, _unreachable)
    app.register_error_handler(redis.exceptions.TimeoutError, _unreachable)
    app.register_error_handler(StoreError, lambda e: _problem(Problem(400, str(e))))
    app.register_error_handler(operations.NotFound, lambda e: _problem(Problem(404, str(e))))
    app.register_error_handler(redis.exceptions.ResponseError,
                               lambda e: _problem(Problem(503, cause(e))))
    return app


def _logged_in():
    """With --console-auth-file, every page but the login asks for one."""
    if console().users.enabled and "who" not in session \
            and request.endpoint not in OPEN_ENDPOINTS:
        return redirect(url_for("pages.login", next=request.full_path))
    return None


def _no_framing(response):
    """No page of the console in another site's frame, no guessing of content types."""
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
        "frame-ancestors 'none'")
    return response


def _problem(problem: Problem):
    return render_template("problem.html", text=problem.text), problem.status


def _unreachable(error: Exception):
    log.warning("redis at %s is unreachable: %s", redacted_url(console().redis_url),
                type(error).__name__)
    return _problem(Problem(503, f"redis at {redacted_url(console().redis_url)} is "
                                 f"unreachable: try again in a moment"))


def body_text(body: bytes | str | None) -> str:
    """A body as safe text (Go-quoted: control bytes and bad UTF-8 escaped), cut short."""
    if body is None:
        return ""
    text = go_quote(body.encode() if isinstance(body, str) else body)
    return text if len(text) <= PREVIEW else text[:PREVIEW - 4] + '..."'


def size_text(n: float) -> str:
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    step = 0
    while n >= 1024 and step < len(units) - 1:
        n, step = n / 1024, step + 1
    return f"{n:.0f} B" if step == 0 else f"{n:.1f} {units[step]}"
