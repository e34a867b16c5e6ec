"""gnsq producers and consumers in the test's own process (on gevent)."""

import gnsq

from tests.helpers.wait import wait_for


def addr(port):
    """The address of a local broker."""
    return f"127.0.0.1:{port}"


def publish(port, topic, bodies, defer=None):
    """Publish each body with a gnsq Producer, deferred by `defer` ms if given."""
    producer = gnsq.Producer([addr(port)])
    producer.start()
    try:
        for body in bodies:
            producer.publish(topic, body, defer=defer)
    finally:
        producer.close()
        producer.join(5)


def round_trip(port, topic, count) -> list:
    """Publish count bodies (b"0", b"1", ...) and read them back on channel c (FIN each):
    the bodies received, sorted."""
    publish(port, topic, [b"%d" % i for i in range(count)])
    got = []
    c = consumer(port, topic, "c", lambda m: (got.append(m.body), m.finish()))
    assert wait_for(lambda: len(got) == count)
    stop(c)
    return sorted(got)


def consumer(port, topic, channel, handler, ports=None, **kwargs):
    """A started gnsq Consumer calling handler(message); messages are async (no auto-FIN)."""
    c = gnsq.Consumer(topic, channel, [addr(p) for p in (ports or [port])],
                      max_in_flight=kwargs.pop("max_in_flight", 10), **kwargs)

    def on_message(_, message):
        message.enable_async()
        handler(message)

    c.on_message.connect(on_message, weak=False)

    c.start(block=False)
    return c


def stop(*consumers):
    """Close consumers and wait for them to finish."""
    for c in consumers:
        c.close()
    for c in consumers:
        c.join(5)
