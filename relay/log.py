"""Structured logging: one logfmt line per event, quiet (info) by default."""

import logging
import sys
import time

import gevent

# nsqd's level names (nsqd --log-level), and Python's "warning"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
          "warning": logging.WARNING, "error": logging.ERROR, "fatal": logging.CRITICAL}


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        msg = record.getMessage().replace('"', '\\"')
        line = f'ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} ' \
               f'logger={record.name} msg="{msg}"'
        if record.exc_info:
            line += ' error="' + self.formatException(record.exc_info).replace('"', "'") \
                .replace("\n", "\\n") + '"'
        return line


def set_level(name: str) -> None:
    """Log from level `name` (one of LEVELS, any case) up; KeyError for another name."""
    logging.getLogger().setLevel(LEVELS[name.lower()])


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    set_level(level)
    logging.getLogger("redis").setLevel(logging.WARNING)


class ClientFaults:
    """Faults that clients cause (malformed or aborted requests, resets), logged within a
    fixed budget however fast they come: at most DEBUG_LINES lines at debug a window, and
    at its end one info line per address (the busiest MOST_ADDRESSES, then one for the
    rest), e.g. "1,204 aborted HTTP requests in the last 10 s from 127.0.0.1"."""

    WINDOW = 10.0
    DEBUG_LINES = 10
    MOST_ADDRESSES = 5

    def __init__(self, logger: logging.Logger, what: str):
        self.log = logger
        self.what = what
        self.counts: dict[tuple[str, str], int] = {}
        self.debug_lines = 0
        self.timer: gevent.Greenlet | None = None

    def note(self, fault: str, address, detail: str) -> None:
        host = address[0] if isinstance(address, tuple) else str(address)
        self.counts[(fault, host)] = self.counts.get((fault, host), 0) + 1
        if self.debug_lines < self.DEBUG_LINES and self.log.isEnabledFor(logging.DEBUG):
            self.debug_lines += 1
            self.log.debug("%s %s from %s: %s", fault, self.what, host, detail)
        if self.timer is None:
            self.timer = gevent.spawn_later(self.WINDOW, self.summarize)

    def summarize(self) -> None:
        counts, self.counts = self.counts, {}
        self.debug_lines, self.timer = 0, None
        ranked = sorted(counts.items(), key=lambda item: -item[1])
        for (fault, host), n in ranked[:self.MOST_ADDRESSES]:
            self.log.info("%s %s %s in the last %d s from %s", f"{n:,}", fault, self.what,
                          self.WINDOW, host)
        rest = ranked[self.MOST_ADDRESSES:]
        if rest:
            self.log.info("%s more faulty %s in the last %d s from %d other addresses",
                          f"{sum(n for _, n in rest):,}", self.what, self.WINDOW,
                          len({host for (_, host), _ in rest}))
