"""Drive the real pynsq (tornado) client in its own process; prints one JSON line per event.

    python -m tests.helpers.pynsq_client publish PORT TOPIC BODY...
    python -m tests.helpers.pynsq_client consume PORT TOPIC CHANNEL COUNT [--requeue-first DELAY_MS]
    python -m tests.helpers.pynsq_client lookup HTTP_PORT TOPIC CHANNEL COUNT
"""

import json
import time
import sys

import nsq
from tornado.ioloop import IOLoop


def publish(port, topic, bodies):
    writer = nsq.Writer([f"127.0.0.1:{port}"])
    results = []

    def done(conn, data):
        results.append(data.decode() if isinstance(data, bytes) else str(data))
        if len(results) == len(bodies):
            print(json.dumps({"published": results}), flush=True)
            IOLoop.current().stop()

    def start():
        for body in bodies:
            writer.pub(topic, body.encode(), callback=done)

    IOLoop.current().call_later(1.0, start)
    IOLoop.current().call_later(20, IOLoop.current().stop)
    nsq.run()


def consume(port, topic, channel, count, requeue_first=None):
    finished = []

    def handler(message):
        print(json.dumps({"id": message.id.decode(), "body": message.body.decode(),
                          "attempts": message.attempts, "at": time.monotonic()}),
              flush=True)
        if requeue_first is not None and message.attempts == 1:
            message.requeue(time_ms=requeue_first, backoff=False)
            return None
        message.finish()
        finished.append(message.id)
        if len(finished) >= count:
            IOLoop.current().call_later(0.3, IOLoop.current().stop)
        return None

    nsq.Reader(topic=topic, channel=channel, message_handler=handler,
               nsqd_tcp_addresses=[f"127.0.0.1:{port}"], max_in_flight=10)
    IOLoop.current().call_later(30, IOLoop.current().stop)
    nsq.run()


def lookup(http_port, topic, channel, count):
    """A Reader that knows only a lookupd address; prints the brokers it connected to."""
    bodies = []

    def handler(message):
        bodies.append(message.body.decode())
        if len(bodies) >= count:
            IOLoop.current().call_later(0.3, report)
        return True

    def report():
        print(json.dumps({"bodies": sorted(bodies), "connections": sorted(reader.conns)}),
              flush=True)
        IOLoop.current().stop()

    reader = nsq.Reader(topic=topic, channel=channel, message_handler=handler,
                        lookupd_http_addresses=[f"http://127.0.0.1:{http_port}"],
                        max_in_flight=10)
    IOLoop.current().call_later(30, report)
    nsq.run()


if __name__ == "__main__":
    mode, port, topic = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "publish":
        publish(port, topic, sys.argv[4:])
    elif mode == "lookup":
        lookup(port, topic, sys.argv[4], int(sys.argv[5]))
    else:
        extra = sys.argv[6:]
        delay = int(extra[1]) if extra[:1] == ["--requeue-first"] else None
        consume(port, topic, sys.argv[4], int(sys.argv[5]), delay)
