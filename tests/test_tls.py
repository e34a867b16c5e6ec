"""TLS, snappy and deflate negotiated by IDENTIFY, with a test CA (trustme): raw clients
for exact bytes, and pynsq for what a real client does."""

import hashlib
import http.client
import ssl
import time

import pytest

from relay.codec import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, parse_record
from relay.store import Store
from relay.store.connection import connect
from tests.helpers.api import Api
from tests.helpers.pynsq import run_pynsq_secure
from tests.helpers.tls import Secure, body_of, tls_broker
from tests.helpers.wire import Wire

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

SIZES = [1, 100, 65_536, 1_048_576]


def roundtrip(port, pki=None, **features):
    """PUB bodies of 1 B to 1 MiB and consume them, both connections negotiated alike."""
    producer, consumer = Secure(port), Secure(port)
    for conn in (producer, consumer):
        response = conn.negotiate(pki, **features)
        assert all(response[k] == v for k, v in features.items())
    assert consumer.sub("t", "c", rdy=len(SIZES)) == (FRAME_RESPONSE, b"OK")
    for size in SIZES:
        assert producer.pub("t", body_of(size)) == (FRAME_RESPONSE, b"OK")
    got = []
    for _ in SIZES:
        kind, data = consumer.frame()
        assert kind == FRAME_MESSAGE
        _, _, msg_id, body = parse_record(data)
        got.append(body)
        consumer.command(b"FIN " + msg_id)
    assert got == [body_of(size) for size in SIZES]
    return consumer


@pytest.mark.parametrize("features", [
    {"tls_v1": True}, {"snappy": True}, {"deflate": True, "deflate_level": 9},
    {"tls_v1": True, "snappy": True}, {"tls_v1": True, "deflate": True}])
def test_negotiated_transports_carry_bodies_byte_exact(processes, pki, features):
    port, _ = tls_broker(processes, pki, "--max-deflate-level", "9")
    consumer = roundtrip(port, pki, **features)
    api = Api(port, processes.http_ports[port])
    [client] = api.json("GET", "/stats?format=json")[1]["topics"][0]["channels"][0]["clients"]
    assert (client["tls"], client["snappy"], client["deflate"]) == (
        features.get("tls_v1", False), features.get("snappy", False),
        features.get("deflate", False))
    if client["tls"]:
        assert client["tls_version"] in ("TLS12", "TLS13") and client["tls_cipher_suite"]
    consumer.close()


def test_identify_answers_what_it_will_do(processes, pki):
    port, _ = tls_broker(processes, pki, "--max-deflate-level", "4", "--snappy", "false")
    w = Secure(port)
    response = w.negotiate(pki, snappy=True, deflate=True, deflate_level=9)
    assert (response["tls_v1"], response["snappy"], response["deflate"],
            response["deflate_level"], response["max_deflate_level"]) == (False, False, True, 4, 4)
    _, plain_port = processes.broker()
    w = Secure(plain_port)
    assert w.negotiate(tls_v1=True)["tls_v1"] is False      # no certificate: no TLS
    w = Secure(plain_port)
    assert w.negotiate(snappy=True, deflate=True) == (
        FRAME_ERROR, b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")
    assert w.closed()


def test_tls_required_for_tcp_and_http(processes, pki):
    port, https_port = tls_broker(processes, pki, "--tls-required", "true")
    w = Wire(port)
    assert w.pub("t", b"x") == (FRAME_ERROR, b"E_INVALID cannot PUB in current state "
                                             b"(TLS required)")
    assert w.closed()
    w = Secure(port)
    w.negotiate()
    w.command("SUB t c")
    assert w.frame() == (FRAME_ERROR, b"E_INVALID cannot SUB in current state (TLS required)")
    w = Secure(port)
    w.negotiate(pki, tls_v1=True)
    assert w.pub("t", b"x") == (FRAME_RESPONSE, b"OK")

    api = Api(port, processes.http_ports[port])
    assert api.json("POST", "/pub?topic=t", b"x") == (403, {"message": "TLS_REQUIRED"})
    assert api.request("GET", "/ping")[:2] == (200, b"OK")
    https = http.client.HTTPSConnection(
        "127.0.0.1", https_port, context=ssl.create_default_context(cafile=pki["ca"]))
    https.request("POST", "/pub?topic=t", body=b"over https")
    reply = https.getresponse()
    assert (reply.status, reply.read()) == (200, b"OK")
    assert Store(connect(processes.redis_url)).reads.read_topic("t")["message_count"] == 2

    port, _ = tls_broker(processes, pki, "--tls-required", "tcp-https")
    assert Api(port, processes.http_ports[port]).request("POST", "/pub?topic=t", b"x")[:2] \
        == (200, b"OK")
    assert Wire(port).pub("t", b"x")[0] == FRAME_ERROR


def test_client_certificate_policy(processes, pki):
    port, _ = tls_broker(processes, pki, "--tls-root-ca-file", pki["ca"],
                         "--tls-client-auth-policy", "require-verify")
    w = Secure(port)
    with pytest.raises((ssl.SSLError, EOFError, ConnectionResetError)):
        w.negotiate(pki, tls_v1=True)
        w.pub("t", b"x")
    w = Secure(port)
    w.negotiate(pki, client_cert=True, tls_v1=True)
    assert w.pub("t", b"x") == (FRAME_RESPONSE, b"OK")


def test_pynsq_with_tls_snappy_and_deflate(processes, pki):
    port, _ = tls_broker(processes, pki)
    for features in ({"tls_v1": True, "snappy": True}, {"deflate": True, "deflate_level": 3}):
        conn = {**features, "tls_options": {"ca_certs": pki["ca"]}}
        topic = "tls" if features.get("tls_v1") else "deflate"
        assert run_pynsq_secure(port, topic, conn, SIZES) == {
            "published": len(SIZES),
            "received": sorted(hashlib.sha256(body_of(n)).hexdigest() for n in SIZES)}


def test_sample_rate_delivers_that_share(processes):
    _, port = processes.broker()
    processes.scanner()
    consumer = Wire(port)
    consumer.identify(sample_rate=30)
    assert consumer.sub("t", "c", rdy=2500) == (FRAME_RESPONSE, b"OK")
    producer = Wire(port)
    for i in range(100):
        assert producer.mpub("t", [b"%d" % (i * 100 + j) for j in range(100)]) == (
            FRAME_RESPONSE, b"OK")
    received = 0
    consumer.sock.settimeout(1.0)
    with pytest.raises(TimeoutError):
        while True:
            kind, data = consumer.frame()
            assert kind == FRAME_MESSAGE
            consumer.command(b"FIN " + parse_record(data)[2])
            received += 1
    api = Api(port, processes.http_ports[port])
    channel = api.json("GET", "/stats?format=json")[1]["topics"][0]["channels"][0]
    # binomial(10,000, 0.30): mean 3,000, sd 46; the bounds are 5 sd
    assert 2770 <= received <= 3230
    assert (channel["depth"], channel["in_flight_count"], channel["message_count"]) == (
        0, 0, 10_000)


def count_writes(port, topic, **identify):
    """Receive 2,000 messages published in 100 MPUBs over ~1 s; how many recv() calls
    (the broker's writes, as the client reads faster than they come) it took."""
    consumer = Wire(port)
    consumer.identify(**identify)
    assert consumer.sub(topic, "c", rdy=2500) == (FRAME_RESPONSE, b"OK")
    producer = Wire(port)
    reads, received = 0, b""
    consumer.sock.settimeout(0.005)
    for i in range(100):
        assert producer.mpub(topic, [b"m" * 100] * 20) == (FRAME_RESPONSE, b"OK")
        deadline = time.monotonic() + 0.01
        while time.monotonic() < deadline:
            try:
                chunk = consumer.sock.recv(1 << 20)
            except TimeoutError:
                continue
            reads += 1
            received += chunk
    consumer.sock.settimeout(1.5)   # past the last flush's timeout
    try:
        while chunk := consumer.sock.recv(1 << 20):
            reads += 1
            received += chunk
    except TimeoutError:
        pass
    assert received.count(b"m" * 100) == 2000
    consumer.close()
    producer.close()
    return reads


def test_output_buffering_means_fewer_larger_writes(processes):
    _, port = processes.broker()
    unbuffered = count_writes(port, "now", output_buffer_timeout=-1)
    # flushed when 16 KiB fill (about 16 times), not each 100 ms a slow machine takes
    buffered = count_writes(port, "later", output_buffer_size=16384, output_buffer_timeout=1000)
    print(f"writes: {unbuffered} unbuffered, {buffered} buffered")
    assert unbuffered >= 50          # about one write per MPUB
    assert buffered <= unbuffered / 3
