"""Run the console: wait for Redis as every relay process does, then serve the Flask app
on --console-address through the broker's strict HTTP/1.1 server until SIGTERM or
SIGINT."""

import logging
import os

from relay.broker.auth import load_file
from relay.broker.broker import stop_on_signals
from relay.broker.http.http1 import Http1Server, Reply
from relay.console.app import MAX_FORM_BYTES, create_app
from relay.options import Options, redacted_url
from relay.sockio import listen
from relay.store import Store, replication
from relay.store.connection import connect_when_ready
from relay.store.layout import check

log = logging.getLogger("relay.console")

TOO_BIG = Reply("413 Request Entity Too Large", [("Content-Type", "text/plain; charset=utf-8")],
                b"413 Request Entity Too Large: a console form is at most 64 KiB")


NICENESS = 10   # a host's brokers and Redis come first: pages can wait


def serve(options: Options) -> None:
    os.nice(NICENESS)
    stop = stop_on_signals()
    if options.console_auth_file:
        load_file(options.console_auth_file)    # a bad file fails before the wait
    listener = listen(options.console_address)     # a port in use fails before the wait
    # a data layout this release cannot read: one line, not a page (check)
    ready = connect_when_ready(options, stop.is_set, log, stop.wait, first=check)
    if ready is None:
        return
    client = ready[0]
    store = Store(client, **replication(options))
    server = Http1Server(listener, create_app(store, options),
                         lambda method, path: (MAX_FORM_BYTES, TOO_BIG))
    server.start()
    host, port = server.socket.getsockname()[:2]
    log.info("console on http://%s:%s/ (redis %s, %s%s)", host, port,
             redacted_url(options.redis_url),
             "writes" if options.console_write else "read-only",
             ", login with --console-auth-file" if options.console_auth_file else "")
    stop.wait()
    server.close()
