"""pynsq with negotiated features: publish bodies of the given sizes with a Writer, read
them back with a Reader on the same connection settings, print what arrived.

    python -m tests.helpers.pynsq_secure PORT TOPIC '{"tls_v1": true, "snappy": true, ...}' SIZE...
"""

import hashlib
import json
import sys

import nsq
from tornado.ioloop import IOLoop

from tests.helpers.tls import body_of


def main(port, topic, conn, sizes):
    loop = IOLoop.current()
    received, published = [], []
    address = [f"127.0.0.1:{port}"]

    def handler(message):
        received.append(hashlib.sha256(message.body).hexdigest())
        if len(received) == len(sizes):
            loop.call_later(0.2, report)
        return True

    def report():
        print(json.dumps({"published": len(published), "received": sorted(received)}),
              flush=True)
        loop.stop()

    def done(_, data):
        published.append(data)

    writer = nsq.Writer(address, **conn)
    nsq.Reader(topic=topic, channel="c", message_handler=handler, nsqd_tcp_addresses=address,
               max_in_flight=10, **conn)

    def start():
        for size in sizes:
            writer.pub(topic, body_of(size), callback=done)
    loop.call_later(1.5, start)
    loop.call_later(30, report)
    nsq.run()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), [int(n) for n in sys.argv[4:]])
