"""The scanner: requeues in-flight messages past their deadline and deferred messages
that are due (nsqd's queueScanLoop, moved out of the broker).

Every script that puts a message in flight or defers it lowers the channel's
score in the due index (`relay:due`) to that deadline. The scanner reads the
entries whose score has passed (Redis time), runs scan.lua on each of those
channels in one pipeline, and each call resets the channel's score to its next
deadline. Idle channels cost nothing, so it stays prompt with any number of
channels. When a call could not move everything that was due, the channel is
still due and the scanner loops again at once (nsqd's dirty-percent rule,
without sampling). Passes start every interval, as nsqd's ticker: sleeping a
full interval after each pass added the pass time to every wait (10,000 channels,
33k requeues/s: steady max lateness ~230 -> ~150 ms, scripts/scanner_scale.py).
Any number of scanners may run: scan.lua is atomic, so a message is requeued once.
Scanners also publish dead letters to their dead-letter topic (relay/deadletter.py).
"""

import logging
import random
import signal
import time

from relay import deadletter
from relay.errors import StoreConnectionError, StoreError
from relay.store import Store, connect_redis

log = logging.getLogger("relay.scanner")

CHANNELS_PER_PASS = 500


class Scanner:
    def __init__(self, store: Store, interval_ms: int = 100, limit: int = 1000,
                 sleep=time.sleep, clock=time.monotonic,
                 dead_letter_topic=deadletter.DEFAULT_TEMPLATE):
        self.store = store
        self.interval = interval_ms / 1000
        self.limit = limit
        self.sleep = sleep
        self.clock = clock
        self.dead_letter_topic = dead_letter_topic
        self.running = True
        self.timed_out = self.promoted = self.dead = 0

    def scan_once(self) -> bool:
        """One pass over the due channels; True if some are still due (loop again)."""
        now, due = self.store.due_channels(CHANNELS_PER_PASS)
        if not due:
            return False
        random.shuffle(due)
        results = self.store.run_many([self.store.scan_op(t, c, self.limit) for t, c, _ in due])
        busy = len(due) == CHANNELS_PER_PASS
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
            busy = busy or (next_due != -1 and next_due <= now)
        return busy

    def _forward_dead(self, topic: str, channel: str) -> None:
        try:
            self.dead += deadletter.forward(self.store, topic, channel, self.dead_letter_topic)
        except StoreError as e:
            log.error("dead letters of %s/%s not forwarded: %s", topic, channel, e)

    def run(self) -> None:
        log.info("scanner started interval=%dms limit=%d", self.interval * 1000, self.limit)
        while self.running:
            started = self.clock()
            try:
                busy = self.scan_once()
            except StoreConnectionError as e:
                log.warning("redis unreachable: %s; retrying", e)
                self.sleep(1.0)
                continue
            if not busy:
                self.sleep(max(0.0, started + self.interval - self.clock()))
        log.info("scanner stopped timed_out=%d promoted=%d dead=%d", self.timed_out,
                 self.promoted, self.dead)

    def stop(self, *_) -> None:
        self.running = False


def main(options) -> None:
    scanner = Scanner(Store(connect_redis(options)), options.queue_scan_interval,
                      options.queue_scan_limit, dead_letter_topic=options.dead_letter_topic)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, scanner.stop)
    scanner.run()
