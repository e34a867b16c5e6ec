"""Waiting for what another process, thread or greenlet does: the one deadline loop of
the tests. Sleeps on gevent, so gnsq's greenlets in the test's own process run
meanwhile (in a thread without greenlets it is a plain sleep)."""

import time

import gevent


def wait_for(predicate, timeout=10.0, interval=0.02):
    """Whether predicate() holds within timeout seconds, asked every `interval` s: True
    once it does, else what it says at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        gevent.sleep(interval)
    return predicate()


def wait_until(read, done, timeout=10.0, interval=0.02):
    """read() every `interval` s until done(value) or timeout seconds have passed: the
    last value read (the one done() accepted, or the one at the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value) or time.monotonic() > deadline:
            return value
        gevent.sleep(interval)
