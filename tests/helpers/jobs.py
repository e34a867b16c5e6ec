"""For the admin jobs' tests: a channel filled with many messages, a producer publishing
while a job runs, and a real rq worker running the queued jobs."""

import threading
import time

from rq import Queue, SimpleWorker

from workers import operations
from workers.jobs import worker_connection


def fill(store, topic, n, batch=10_000):
    """Publish n messages (b"old0", b"old1", ...) to topic, `batch` at a time."""
    for start in range(0, n, batch):
        store.publish(topic, [b"old%d" % i for i in range(start, min(n, start + batch))])


class Producer(threading.Thread):
    """Publishes 10 messages at a time until stopped; remembers each id's body and the
    slowest publish."""

    def __init__(self, store, topic):
        super().__init__(daemon=True)
        self.store, self.topic = store, topic
        self.bodies: dict[int, bytes] = {}
        self.times: list[float] = []
        self.slowest = 0.0
        self.stopped = threading.Event()

    def run(self):
        n = 0
        while not self.stopped.is_set():
            batch = [b"new%d" % i for i in range(n, n + 10)]
            started = time.monotonic()
            last = self.store.publish(self.topic, batch)
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.times.append(time.time())
            self.bodies.update(zip(range(last - 9, last + 1), batch))
            n += 10
            time.sleep(0.001)

    def stop(self):
        self.stopped.set()
        self.join(10)


def work(backend):
    """Run every queued job with a real rq worker, in this process (burst mode)."""
    connection = worker_connection(backend)
    queue = Queue(operations.QUEUE, connection=connection)
    SimpleWorker([queue], connection=connection).work(burst=True)
