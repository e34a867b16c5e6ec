"""The scanner: requeues in-flight messages past their deadline and deferred messages
that are due (nsqd's queueScanLoop, moved out of the broker).

Every script that puts a message in flight or defers it lowers the channel's
score in its topic's due index (`relay:{T}:due`, in the topic's slot, so the
scripts stay single-slot on Redis Cluster) to that deadline, and the channel's entry
"<part> <channel>" in its node's due index (`relay:due`, one per node on a cluster:
relay/store/nodes.py) with it. Each pass the scanner reads what is due (by Redis
time) in the node indexes, one ZRANGEBYSCORE per node, so an idle pass costs Redis
one command per node whatever the number of topics (it read every topic's index
before: 2,000 idle topics cost 20,000 commands/s); it runs scan.lua on the due
channels of its share, and each call sets the channel's score in both indexes to its
next deadline, or removes it. Redis time comes from the scanner's clock and an
offset read with TIME every CLOCK_EVERY. When a call could not move everything that
was due, the channel is still due and the scanner loops again at once (nsqd's
dirty-percent rule, without sampling). Passes start every interval, as nsqd's ticker:
sleeping a full interval after each pass added the pass time to every wait (10,000
channels, 33k requeues/s: steady max lateness ~230 -> ~150 ms,
scripts/scanner_scale.py).

The node index is made up from the topics' own (seed.lua, Store.seed_due) when the
scanner starts (a restarted Redis may have lost writes, a node index may be lost),
reconnects, takes a new share, or sees a cluster's slots move (checked every
TOPOLOGY_EVERY); and every part of its share is seeded again by a sweep, a slice every
second, the whole share in SWEEP_EVERY seconds or, past SWEEP_MOST parts a second,
longer: a safety net for a node index write lost (sent to a stale node's keys), at a
bounded cost. The sweep also trims the swept parts' histories (trim.lua), so a topic with retention that nobody publishes to is trimmed
too, within SWEEP_EVERY of its due time (a big trim, in calls of a bounded cost, for up
to TRIM_SECONDS a slice, going on at the part's next sweep), finishes the staged MPUBs
that a dead broker committed but left part published (data_path.finish_stalled, in
steps, for up to TRIM_SECONDS a slice too), and takes the expired
messages out of the head of their channels' queues (expire.lua, in calls of a bounded
cost too, for what is left of TRIM_SECONDS), so a channel with a TTL that nobody
consumes does not keep them.

Scanners share the work by hash slot: each registers in `relay:scanners` with a
heartbeat (relay/liveness.py, as brokers do), and the one of rank i among the n
live ones takes the topics whose slot is i modulo n. A scanner that joins or stops
changes the share at the next heartbeat of the others; one killed with -9 leaves
its share uncovered until its registration expires (SHARE_TTL), after which the
others take it over: messages are requeued late, never lost. Overlaps while the
share changes are harmless: scan.lua is atomic, so a message is requeued once.
Scanners also publish dead letters to their dead-letter topic (relay/store/deadletter.py)
and reap what dead brokers left (workers/reaper.py).
"""

import bisect
import logging
import math
import random
import signal
import sys
import time
from functools import cached_property, lru_cache

from redis.crc import key_slot
from redis.exceptions import RedisClusterException, RedisError

from relay.errors import ConfigError, StoreConnectionError, StoreError
from relay.liveness import Liveness, new_id
from relay.options import redacted_url
from relay.store import Store, codes, deadletter, guarded, keys, replication
from relay.store.causes import cause
from relay.store.connection import connect_when_ready, unready, wait_until_ready
from relay.store.keys import TopicKeys
from relay.store.layout import Presence, establish, stop_now
from workers.reaper import Reaper

log = logging.getLogger("relay.scanner")

CLOCK_EVERY = 1.0       # seconds between reads of Redis' clock
TOPOLOGY_EVERY = 5.0    # seconds between checks of a cluster's slots
SWEEP_STEP = 1.0        # seconds between slices of the sweep
SWEEP_EVERY = 60.0      # a sweep of the whole share takes this long...
SWEEP_MOST = 40         # ...or longer, at most this many parts a second
TRIM_SECONDS = 0.5      # a slice's trims and expiries (bounded calls) stop after this
SHARE_HEARTBEAT = 1.0
SHARE_TTL_MS = 5_000
PRESENCE_EVERY = 5.0    # seconds between registrations as a process of its release


class Share:
    """This scanner's part of the hash slots: rank i of n live scanners takes the slots
    equal to i modulo n, and the topics in them."""

    def __init__(self, store: Store, scanner_id: str, clock=time.time,
                 layout: int | None = None):
        """`layout`: the data layout in force when it started; given, the scanner also
        registers as a process of its release (relay/store/layout.py), every
        PRESENCE_EVERY, and stops if the layout in force becomes one it cannot read."""
        self.store = store
        self.id = scanner_id
        self.clock = clock
        self.presence = None if layout is None else \
            Presence(store.redis, "scanner", scanner_id, layout)
        self._present = float("-inf")
        self.rank, self.size = 0, 1
        self.topics: list[str] = []
        self.moved = False     # the share changed since the scanner last seeded it
        self._renewed = float("-inf")

    @cached_property
    def scanners(self) -> Liveness:
        """The live scanners, on the store's client (made at first use)."""
        return Liveness(self.store.redis, keys.SCANNERS, SHARE_TTL_MS, self.clock)

    def renew(self) -> None:
        """Heartbeat, then learn the live scanners and the topics (every SHARE_HEARTBEAT)."""
        now = self.clock()
        if now - self._renewed < SHARE_HEARTBEAT:
            return
        rank, size = guarded(self.scanners.rank, self.id)
        if (rank, size) != (self.rank, self.size):
            log.info("scanner %s: share %d of %d", self.id, rank, size)
            self.moved = True
        self.rank, self.size = rank, size
        self.topics = [t for t in self.store.reads.stored_parts() if self.covers(t)]
        self._renewed = now
        if self.presence is not None and now - self._present >= PRESENCE_EVERY:
            refused = guarded(self.presence.heartbeat)
            if refused:
                stop_now(refused)
            self._present = now

    def covers(self, topic: str) -> bool:
        return _slot(topic) % self.size == self.rank

    def leave(self, unreachable: str | None = None) -> None:
        """Deregister, unless Redis is known `unreachable` (why): then, or if leaving
        fails, one line says the registration expires by itself."""
        try:
            if unreachable is None:
                self.scanners.leave(self.id)
                if self.presence is not None:
                    self.presence.leave()
                return
        except Exception as e:  # leaving is a courtesy: the registration expires anyway
            unreachable = str(e)
        log.warning("redis unreachable while stopping (%s): the registration of scanner %s "
                    "expires by itself within %d s, then the other scanners take over its "
                    "share", unreachable, self.id, SHARE_TTL_MS // 1000)


class Scanner:
    def __init__(self, store: Store, interval_ms: int = 100, limit: int = 1000,
                 sleep=time.sleep, clock=time.monotonic,
                 dead_letter_topic=deadletter.DEFAULT_TEMPLATE, share: Share | None = None,
                 redis_url: str | None = None, max_attempts: int = 0):
        """`redis_url`: where an unreachable Redis is waited for (wait_until_ready);
        without it, passes are retried every second meanwhile. `max_attempts`: the
        brokers' --max-attempts, which says whether the sweep's expired messages of a
        channel without its own setting are dead letters, as at delivery."""
        self.store = store
        self.redis_url = redis_url
        self.interval = interval_ms / 1000
        self.limit = limit
        self.sleep = sleep
        self.clock = clock
        self.dead_letter_topic = dead_letter_topic
        self.max_attempts = max_attempts
        self.share = share or Share(store, new_id())
        self.reaper = Reaper(store, self.share.id, clock)
        self.running = True
        self.timed_out = self.promoted = self.dead = 0
        self.seeded = False     # the node due indexes seeded from the share's parts
        self.offset_ms = 0.0    # Redis' clock less this host's
        self._clock_read = self._topology_read = self._swept = float("-inf")
        self._sweep_after = ""  # the last part swept
        self._failing: str | None = None    # why passes fail, while they fail alike

    def _failed(self, why: str | None) -> None:
        """One line when passes start failing (a full Redis refuses each alike, five a
        second), or fail otherwise, and one when they pass again."""
        if why != self._failing:
            if why is None:
                log.info("scan passes again")
            else:
                log.warning("scan pass failed: %s; retrying", why)
            self._failing = why

    def scan_once(self) -> bool:
        """One pass over the due channels of this scanner's share; True if some are
        still due (loop again)."""
        self.share.renew()
        self.reaper.check(self.share.topics)
        if not self.share.topics:
            return False
        self._upkeep()
        now, due, more, _ = self.store.reads.due_channels(self.now_ms())
        due = [entry for entry in due if self.share.covers(entry[0])]
        if not due:
            return False
        busy = more
        random.shuffle(due)
        results = self.store.run_many([self.store.scan_op(t, c, self.limit) for t, c, _ in due])
        for (topic, channel, _), result in zip(due, results):
            if isinstance(result, Exception):
                log.error("scan %s/%s failed: %s", topic, channel, result)
                continue
            timed_out, promoted, next_due, dead = result
            self.timed_out += timed_out
            self.promoted += promoted
            if dead:
                self._forward_dead(topic, channel)
            if timed_out or promoted:
                log.debug("%s/%s: %d timed out, %d deferred due", topic, channel,
                          timed_out, promoted)
            busy = busy or (next_due != codes.NO_TIME and next_due <= now)
        return busy

    def now_ms(self) -> int:
        """Redis' clock (ms), as this host's and the offset last read: a little behind,
        never ahead."""
        return int(time.time() * 1000 + self.offset_ms)

    def _upkeep(self) -> None:
        """Redis' clock every CLOCK_EVERY, a cluster's slots every TOPOLOGY_EVERY, then
        the seeding of the node due indexes if due, else the next slice of the sweep
        (every SWEEP_STEP). A seeding that failed is tried again a step later, without
        holding up the passes; one that could not reach Redis fails the pass, whose
        outage line says so (run), rather than a warning of its own before it."""
        now = self.clock()
        if now - self._clock_read >= CLOCK_EVERY:
            self._clock_read = now
            redis_ms = self.store.now_ms()
            # as if Redis read its clock when the reply came back: never ahead of Redis
            # (but for drift until the next read), or passes would scan channels not
            # due yet, and loop at once on them (their next due time looks past)
            self.offset_ms = redis_ms - time.time() * 1000
        if now - self._topology_read >= TOPOLOGY_EVERY:
            self._topology_read = now
            if guarded(self.store.nodes.moved):
                log.info("the cluster's slots moved: seeding the node due indexes again")
                self.reseed()
        if self.share.moved:
            self.share.moved = False
            self.reseed()
        if now - self._swept < SWEEP_STEP:
            return
        self._swept = now
        try:
            if self.seeded:
                swept = self.sweep_slice()
                self.store.reads.seed_due(swept)
                self._finish_stalled(swept)
                self._trim_and_expire(swept)
                return
            seen = self.store.reads.seed_due(self.share.topics)
            self.seeded = True
            log.info("node due indexes seeded from %d parts (%d entries)",
                     len(self.share.topics), seen)
        except StoreConnectionError:
            raise   # an outage, which the pass reports (run) and which seeds again
        except StoreError as e:
            log.warning("node due indexes not %s: %s", "swept" if self.seeded else "seeded", e)

    def _finish_stalled(self, parts: list[str]) -> None:
        """The staged publishes of `parts` whose broker died between their commit and
        their last step, finished (rolled forward) within TRIM_SECONDS; what is left
        goes on at the parts' next sweep."""
        try:
            published = self.store.finish_stalled(parts, TRIM_SECONDS)
        except StoreConnectionError:
            raise
        except StoreError as e:
            log.warning("stalled publishes of swept parts not finished: %s", e)
            return
        if published:
            log.info("finished stalled staged publishes: %d messages published", published)

    def _trim_and_expire(self, parts: list[str]) -> None:
        """The histories of `parts` trimmed, then their expired messages taken out,
        within TRIM_SECONDS (one round of calls each at least)."""
        started = time.monotonic()
        try:
            self.store.history.trim_parts(parts, TRIM_SECONDS)
        except StoreConnectionError:
            raise
        except StoreError as e:
            log.warning("histories of swept parts not trimmed: %s", e)
        left = max(0.0, TRIM_SECONDS - (time.monotonic() - started))
        try:
            self.store.expiry.expire_parts(parts, left, self.max_attempts)
        except StoreConnectionError:
            raise
        except StoreError as e:
            log.warning("expired messages of swept parts not taken out: %s", e)

    def reseed(self) -> None:
        """Seed the node due indexes from the share's parts at the next pass."""
        self.seeded, self._swept = False, float("-inf")

    def sweep_slice(self) -> list[str]:
        """The next parts of the share to seed again, after the last ones (by name)."""
        parts = self.share.topics
        n = min(math.ceil(len(parts) * SWEEP_STEP / SWEEP_EVERY), int(SWEEP_MOST * SWEEP_STEP))
        start = bisect.bisect_right(parts, self._sweep_after)
        chosen = (parts[start:] + parts[:start])[:n]
        if chosen:
            self._sweep_after = chosen[-1]
        return chosen

    def _forward_dead(self, part: str, channel: str) -> None:
        try:
            self.dead += deadletter.forward(self.store, part, channel, self.dead_letter_topic)
        except StoreError as e:
            log.error("dead letters of %s/%s not forwarded: %s", part, channel, e)

    def run(self) -> None:
        log.info("scanner started interval=%dms limit=%d", self.interval * 1000, self.limit)
        unreachable = None
        while self.running:
            started = self.clock()
            try:
                busy = self.scan_once()
            except (StoreConnectionError, RedisClusterException) as e:
                unreachable = self._outage(e)
                continue
            except (StoreError, RedisError) as e:
                self._failed(cause(e))  # e.g. a slot moving, a full Redis or disk
                self.sleep(0.2)
                continue
            self._failed(None)
            unreachable = None
            if not busy:
                self.sleep(max(0.0, started + self.interval - self.clock()))
        self.share.leave(unreachable)
        log.info("scanner stopped timed_out=%d promoted=%d dead=%d reaped=%d", self.timed_out,
                 self.promoted, self.dead, self.reaper.reaped)

    def _outage(self, error: Exception) -> str | None:
        """A pass that could not reach Redis (or a cluster that cannot serve a slot):
        wait until it can again, in one line and one more once it can; a failure of
        another kind is retried at once. Why Redis is unreachable, if stopped meanwhile."""
        self.reseed()  # a restarted or failed-over Redis may have lost writes
        if self.redis_url is None or unready(self.redis_url) is None:
            log.warning("scan pass failed: %s; retrying", cause(error))
            self.sleep(0.2 if isinstance(error, RedisClusterException) else 1.0)
            return None
        if wait_until_ready(self.redis_url, lambda: not self.running, log, self.sleep):
            return None
        return str(error)

    def stop(self, *_) -> None:
        self.running = False


@lru_cache(maxsize=65536)
def _slot(part: str) -> int:
    return key_slot(TopicKeys.of(part).due.encode())


def main(options) -> None:
    """`relay scanner`: wait for Redis (no deadline), then scan until SIGTERM or SIGINT,
    which also end the wait."""
    stopping: list[bool] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    try:
        ready = connect_when_ready(options, lambda: bool(stopping), log, first=establish)
    except ConfigError as e:     # a layout it cannot read, a server too old
        print(f"relay: {e}", file=sys.stderr)
        sys.exit(2)
    if ready is None:
        log.info("scanner stopped before redis at %s was ready: it scanned nothing and "
                 "registered nowhere", redacted_url(options.redis_url))
        return
    client, layout = ready
    store = Store(client, **replication(options), topic_partitions=options.topic_partitions,
                  topic_retention_ms=options.retention_time)
    scanner = Scanner(store, options.queue_scan_interval, options.queue_scan_limit,
                      dead_letter_topic=options.dead_letter_topic,
                      share=Share(store, new_id(), layout=layout),
                      redis_url=options.redis_url, max_attempts=options.max_attempts)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, scanner.stop)
    if stopping:
        scanner.stop()
    scanner.run()
