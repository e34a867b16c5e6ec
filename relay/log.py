"""Structured logging: one logfmt line per event, quiet (info) by default."""

import logging
import sys
import time

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
