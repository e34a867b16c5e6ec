"""Deadlines: one greenlet expiring what a broker's greenlets wait on, in ticks."""

import time

import gevent
import pytest

from relay.deadlines import Deadlines


class Wait:
    """An Expiring that notes when it was expired and how often its deadline was read."""

    def __init__(self, expires: float, fail: bool = False) -> None:
        self._expires = expires
        self.fail = fail
        self.reads = 0
        self.expired_at: float | None = None

    @property
    def expires(self) -> float:
        self.reads += 1
        return self._expires

    def expire(self) -> None:
        self.expired_at = time.monotonic()
        if self.fail:
            raise RuntimeError("an expire that fails")


def test_each_expires_at_its_deadline_within_a_tick_and_unwatched_ones_never():
    deadlines = Deadlines()
    now = time.monotonic()
    waits = [Wait(now + delay) for delay in (0.3, 0.1, 0.2, -1.0)]
    left = Wait(now + 0.15)
    for wait in waits + [left]:
        deadlines.watch(wait)
    deadlines.unwatch(left)
    gevent.sleep(0.5)
    late = [wait.expired_at - max(wait._expires, now) for wait in waits]
    assert [0 <= t < Deadlines.TICK + 0.05 for t in late] == [True] * 4, late
    assert left.expired_at is None


def test_an_expire_that_fails_leaves_the_others_expiring():
    deadlines = Deadlines()
    now = time.monotonic()
    waits = [Wait(now + 0.05, fail=True), Wait(now + 0.05), Wait(now + 0.2)]
    for wait in waits:
        deadlines.watch(wait)
    gevent.sleep(0.4)
    assert [wait.expired_at is not None for wait in waits] == [True] * 3


def test_the_keeper_reads_only_what_comes_due(monkeypatch):
    """10,000 waits an hour off are read once, when watched: each tick looks at its own
    slot only, so idle connections cost the keeper nothing."""
    monkeypatch.setattr(Deadlines, "IDLE", 0.1)
    deadlines = Deadlines()
    far = [Wait(time.monotonic() + 3600) for _ in range(10_000)]
    for wait in far:
        deadlines.watch(wait)
    soon = Wait(time.monotonic() + 0.1)
    deadlines.watch(soon)
    gevent.sleep(0.3)
    assert soon.expired_at is not None
    assert {wait.reads for wait in far} == {1}
    for wait in far:
        deadlines.unwatch(wait)
    gevent.sleep(0.3)
    assert deadlines._keeper is None          # nothing watched for IDLE: it ended
    again = Wait(time.monotonic() + 0.1)
    deadlines.watch(again)
    gevent.sleep(0.3)
    assert again.expired_at == pytest.approx(again._expires, abs=Deadlines.TICK + 0.05)
