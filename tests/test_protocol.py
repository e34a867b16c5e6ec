"""Black-box NSQ V2 protocol tests: real sockets against a real broker process.

Every expectation is nsqd v1.3.0's exact wire behaviour (frame type and payload
bytes, which errors are fatal). Where relay deviates, the test still asserts
nsqd's behaviour and is marked xfail(strict=True) with the deviation as reason.
What RDY and CLS do to a client's credit is in test_client.py.

The cases of a test marked reuse_processes run on one broker and scanner per deployment
(tests/helpers/reuse.py): each case's input is refused, and what the refusals leave (a
SUB to t/ch, publishes to `fresh` and `other`) is nothing another case looks at. The
tests whose cases consume messages of t/ch each start their own.
"""

import json
import random
import socket
import time

import pytest

from tests.helpers.api import Api
from tests.helpers.wire import Wire, mpub_body, size, subscribed

pytestmark = pytest.mark.integration     # real processes: -m "not integration" leaves it out

RESPONSE, ERROR = 0, 1
OK = (RESPONSE, b"OK")
HEARTBEAT = (RESPONSE, b"_heartbeat_")
CLOSE_WAIT = (RESPONSE, b"CLOSE_WAIT")

MAX_BODY = 5242880
MAX_MSG = 1048576
DEFAULT_IDENTIFY_REPLY = (
    b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
    b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
    b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,'
    b'"output_buffer_timeout":250}'
)
BOGUS_ID = b"deadbeefdeadbeef"  # 16 bytes, never a real id


# -- helpers -----------------------------------------------------------------------


def assert_serving(port: int) -> None:
    """A second, fresh client can still publish."""
    w = Wire(port)
    try:
        assert w.pub("fresh", b"still serving") == OK
    finally:
        w.close()


def assert_fatal(port: int, w: Wire, payload: bytes) -> None:
    """Exactly this error frame, then the connection is closed with nothing more."""
    assert w.frame() == (ERROR, payload)
    assert w.rest() == b""
    w.close()
    assert_serving(port)


def assert_usable(w: Wire) -> None:
    """After a non-fatal error: the same connection still works."""
    w.command("NOP")
    assert w.pub("other", b"after non-fatal") == OK


@pytest.fixture
def small_broker(processes):
    """A broker with tiny limits: max message 100 bytes, max body 1000 bytes."""
    _, port = processes.broker("--max-msg-size", "100", "--max-body-size", "1000")
    processes.scanner()
    return port


# -- magic -----------------------------------------------------------------------------


def test_bad_magic_gets_e_bad_protocol_then_close(broker):
    w = Wire(broker, magic=b"  V1")
    assert w.frame() == (ERROR, b"E_BAD_PROTOCOL")
    assert w.rest() == b""
    assert_serving(broker)


def test_bad_magic_frame_bytes_exact(broker):
    w = Wire(broker, magic=b"HTTP")
    assert w.rest() == b"\x00\x00\x00\x12\x00\x00\x00\x01E_BAD_PROTOCOL"
    assert_serving(broker)


# -- E_INVALID -----------------------------------------------------------------------


@pytest.mark.parametrize("line, payload", [
    (b"ASDF", b"E_INVALID invalid command ASDF"),
    (b"", b"E_INVALID invalid command "),
    (b"pub t", b"E_INVALID invalid command pub"),
    (b"NOP\tx", b"E_INVALID invalid command NOP\tx"),
])
@pytest.mark.reuse_processes
def test_e_invalid_unknown_command(broker, line, payload):
    w = Wire(broker)
    w.command(line)
    assert_fatal(broker, w, payload)


def test_e_invalid_unknown_command_raw_bytes(broker):
    w = Wire(broker)
    w.command(b"\xff\xfe")
    assert_fatal(broker, w, b"E_INVALID invalid command \xff\xfe")


def test_e_invalid_fatal_stops_pipelined_commands(broker):
    w = Wire(broker)
    w.send(b"ASDF\n" + b"PUB t\n" + size(2) + b"hi")
    assert w.frame() == (ERROR, b"E_INVALID invalid command ASDF")
    assert w.rest() == b""  # the PUB after the fatal error is never answered
    assert_serving(broker)


@pytest.mark.parametrize("line, payload", [
    ("RDY 2501", b"E_INVALID RDY count 2501 out of range 0-2500"),
    ("RDY 99999999999", b"E_INVALID RDY count 99999999999 out of range 0-2500"),
    ("RDY -5", b"E_INVALID RDY could not parse count -5"),
    ("RDY abc", b"E_INVALID RDY could not parse count abc"),
    ("RDY +1", b"E_INVALID RDY could not parse count +1"),
    ("RDY 1.5", b"E_INVALID RDY could not parse count 1.5"),
])
@pytest.mark.reuse_processes
def test_e_invalid_rdy_out_of_range_or_unparsable(broker, line, payload):
    w = subscribed(broker)
    w.command(line)
    assert_fatal(broker, w, payload)


@pytest.mark.parametrize("line, payload", [
    ("RDY 18446744073709551615", b"E_INVALID RDY count -1 out of range 0-2500"),
    ("RDY 99999999999999999999", b"E_INVALID RDY count 7766279631452241919 out of range 0-2500"),
])
@pytest.mark.reuse_processes
def test_e_invalid_rdy_count_wraps_like_go(broker, line, payload):
    w = subscribed(broker)
    w.command(line)
    assert_fatal(broker, w, payload)


def test_rdy_boundaries_are_accepted_silently(broker):
    w = subscribed(broker)
    for line in ("RDY 2500", "RDY 0", "RDY", "RDY "):
        w.command(line)
    assert w.nothing(0.5)
    assert w.pub("other", b"x") == OK


@pytest.mark.parametrize("line, payload", [
    ("RDY 1", b"E_INVALID cannot RDY in current state"),
    ("FIN " + BOGUS_ID.decode(), b"E_INVALID cannot FIN in current state"),
    ("REQ " + BOGUS_ID.decode() + " 0", b"E_INVALID cannot REQ in current state"),
    ("TOUCH " + BOGUS_ID.decode(), b"E_INVALID cannot TOUCH in current state"),
    ("CLS", b"E_INVALID cannot CLS in current state"),
])
@pytest.mark.reuse_processes
def test_e_invalid_command_in_wrong_state(broker, line, payload):
    w = Wire(broker)  # connected, never subscribed
    w.command(line)
    assert_fatal(broker, w, payload)


@pytest.mark.parametrize("line, payload", [
    (b"FIN 123", b"E_INVALID invalid message ID"),
    (b"FIN " + BOGUS_ID + b"0", b"E_INVALID invalid message ID"),
    (b"FIN ", b"E_INVALID invalid message ID"),
    (b"REQ 123 0", b"E_INVALID invalid message ID"),
    (b"TOUCH 123456789012345", b"E_INVALID invalid message ID"),
    (b"FIN", b"E_INVALID FIN insufficient number of params"),
    (b"REQ " + BOGUS_ID, b"E_INVALID REQ insufficient number of params"),
    (b"TOUCH", b"E_INVALID TOUCH insufficient number of params"),
    (b"REQ " + BOGUS_ID + b" -1", b"E_INVALID REQ could not parse timeout -1"),
    (b"REQ " + BOGUS_ID + b" 1s", b"E_INVALID REQ could not parse timeout 1s"),
])
@pytest.mark.reuse_processes
def test_e_invalid_message_id_and_params(broker, line, payload):
    w = subscribed(broker, rdy=1)
    w.command(line)
    assert_fatal(broker, w, payload)


def test_e_invalid_sub_twice(broker):
    w = subscribed(broker)
    w.command("SUB t ch2")
    assert_fatal(broker, w, b"E_INVALID cannot SUB in current state")


def test_e_invalid_identify_after_sub(broker):
    w = subscribed(broker)
    w.command("IDENTIFY", b"{}")
    assert_fatal(broker, w, b"E_INVALID cannot IDENTIFY in current state")


def test_identify_twice_before_sub_is_allowed(broker):
    w = Wire(broker)
    assert w.identify(client_id="a") == OK
    assert w.pub("t", b"x") == OK
    assert w.identify(client_id="b") == OK  # IDENTIFY does not change nsqd's state


def test_e_invalid_cls_twice(broker):
    w = subscribed(broker)
    w.command("CLS")
    assert w.frame() == CLOSE_WAIT
    w.command("CLS")
    assert_fatal(broker, w, b"E_INVALID cannot CLS in current state")


def test_e_invalid_sub_after_cls(broker):
    w = subscribed(broker)
    w.command("CLS")
    assert w.frame() == CLOSE_WAIT
    w.command("SUB t ch")
    assert_fatal(broker, w, b"E_INVALID cannot SUB in current state")


@pytest.mark.parametrize("line, payload", [
    ("DPUB t 3600001", b"E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
    ("DPUB t 99999999999", b"E_INVALID DPUB timeout 99999999999 out of range 0-3600000"),
    ("DPUB t -1", b"E_INVALID DPUB could not parse timeout -1"),
    ("DPUB t 10s", b"E_INVALID DPUB could not parse timeout 10s"),
    ("DPUB t", b"E_INVALID DPUB insufficient number of parameters"),
])
@pytest.mark.reuse_processes
def test_e_invalid_dpub_timeout(broker, line, payload):
    w = Wire(broker)
    w.command(line)  # checked before any body is read
    assert_fatal(broker, w, payload)


def test_dpub_timeout_boundaries_accepted(broker):
    w = Wire(broker)
    w.command("DPUB t 3600000", b"later")
    assert w.frame() == OK
    w.command("DPUB t 0", b"now")
    assert w.frame() == OK


@pytest.mark.parametrize("line", ["SUB t ch", "SUB"])
@pytest.mark.reuse_processes
def test_e_invalid_sub_with_heartbeats_disabled(broker, line):
    w = Wire(broker)
    assert w.identify(heartbeat_interval=-1) == OK
    w.command(line)  # checked before the parameter count
    assert_fatal(broker, w, b"E_INVALID cannot SUB with heartbeats disabled")


@pytest.mark.parametrize("line, payload", [
    ("SUB", b"E_INVALID SUB insufficient number of parameters"),
    ("SUB t", b"E_INVALID SUB insufficient number of parameters"),
    ("PUB", b"E_INVALID PUB insufficient number of parameters"),
    ("MPUB", b"E_INVALID MPUB insufficient number of parameters"),
])
@pytest.mark.reuse_processes
def test_e_invalid_insufficient_parameters(broker, line, payload):
    w = Wire(broker)
    w.command(line)
    assert_fatal(broker, w, payload)


# -- E_BAD_BODY: IDENTIFY ----------------------------------------------------------


@pytest.mark.parametrize("body", [
    b"{not json",
    b"",
    b"[]",
    b'"feature_negotiation"',
    b"1",
    b'{"heartbeat_interval": "1000"}',
    b'{"heartbeat_interval": 1000.5}',
    b'{"heartbeat_interval": 1e3}',
    b'{"heartbeat_interval": true}',
    b'{"client_id": 5}',
    b'{"feature_negotiation": "true"}',
    b'{"msg_timeout": [1000]}',
], ids=lambda b: b.decode() or "empty")
@pytest.mark.reuse_processes
def test_e_bad_body_identify_bad_json(broker, body):
    w = Wire(broker)
    if body:
        w.command("IDENTIFY", body)
        assert_fatal(broker, w, b"E_BAD_BODY IDENTIFY failed to decode JSON body")
    else:
        w.command("IDENTIFY", body)  # size 0
        assert_fatal(broker, w, b"E_BAD_BODY IDENTIFY invalid body size 0")


@pytest.mark.parametrize("body", [
    b"\xef\xbb\xbf{}",
    b"\xef\xbb\xbf{\"client_id\": \"c\"}",
    "{}".encode("utf-16-le"),
    "\ufeff{}".encode("utf-16-le"),
    "{}".encode("utf-16-be"),
    "{}".encode("utf-32-le"),
], ids=["utf8-bom", "utf8-bom-field", "utf16le", "utf16le-bom", "utf16be", "utf32le"])
@pytest.mark.reuse_processes
def test_e_bad_body_identify_json_not_plain_utf8(broker, body):
    """Go's encoding/json reads UTF-8 alone, with no BOM: Python's json.loads of bytes
    skipped a BOM and decoded UTF-16 and UTF-32."""
    w = Wire(broker)
    w.command("IDENTIFY", body)
    assert_fatal(broker, w, b"E_BAD_BODY IDENTIFY failed to decode JSON body")


def test_e_bad_body_identify_number_for_bool(broker):
    w = Wire(broker)
    w.command("IDENTIFY", b'{"feature_negotiation": 1}')
    assert_fatal(broker, w, b"E_BAD_BODY IDENTIFY failed to decode JSON body")


def test_e_bad_body_identify_sample_rate_int32_overflow(broker):
    w = Wire(broker)
    w.command("IDENTIFY", b'{"sample_rate": 2147483648}')
    assert_fatal(broker, w, b"E_BAD_BODY IDENTIFY failed to decode JSON body")


@pytest.mark.parametrize("fields, desc", [
    ({"heartbeat_interval": 999}, "heartbeat interval (999) is invalid"),
    ({"heartbeat_interval": 60001}, "heartbeat interval (60001) is invalid"),
    ({"heartbeat_interval": 300001}, "heartbeat interval (300001) is invalid"),
    ({"heartbeat_interval": -2}, "heartbeat interval (-2) is invalid"),
    ({"output_buffer_size": 63}, "output buffer size (63) is invalid"),
    ({"output_buffer_size": 65537}, "output buffer size (65537) is invalid"),
    ({"output_buffer_size": 524289}, "output buffer size (524289) is invalid"),
    ({"output_buffer_size": -2}, "output buffer size (-2) is invalid"),
    ({"output_buffer_timeout": 24}, "output buffer timeout (24) is invalid"),
    ({"output_buffer_timeout": 30001}, "output buffer timeout (30001) is invalid"),
    ({"output_buffer_timeout": -2}, "output buffer timeout (-2) is invalid"),
    ({"sample_rate": 100}, "sample rate (100) is invalid"),
    ({"sample_rate": -1}, "sample rate (-1) is invalid"),
    ({"msg_timeout": 999}, "msg timeout (999) is invalid"),
    ({"msg_timeout": 900001}, "msg timeout (900001) is invalid"),
    ({"msg_timeout": -1}, "msg timeout (-1) is invalid"),
    # nsqd's validation order: heartbeat, buffer timeout, buffer size, sample rate, msg timeout
    ({"msg_timeout": 1, "sample_rate": 100, "output_buffer_size": 1,
      "output_buffer_timeout": 1, "heartbeat_interval": 1}, "heartbeat interval (1) is invalid"),
    ({"msg_timeout": 1, "sample_rate": 100, "output_buffer_size": 1,
      "output_buffer_timeout": 1}, "output buffer timeout (1) is invalid"),
    ({"msg_timeout": 1, "sample_rate": 100, "output_buffer_size": 1},
     "output buffer size (1) is invalid"),
    ({"msg_timeout": 1, "sample_rate": 100}, "sample rate (100) is invalid"),
], ids=lambda v: json.dumps(v) if isinstance(v, dict) else None)
@pytest.mark.reuse_processes
def test_e_bad_body_identify_invalid_values(broker, fields, desc):
    w = Wire(broker)
    w.command("IDENTIFY", json.dumps(fields).encode())
    assert_fatal(broker, w, b"E_BAD_BODY IDENTIFY " + desc.encode())


@pytest.mark.parametrize("n, payload", [
    (0, b"E_BAD_BODY IDENTIFY invalid body size 0"),
    (-1, b"E_BAD_BODY IDENTIFY invalid body size -1"),
    (MAX_BODY + 1, b"E_BAD_BODY IDENTIFY body too big 5242881 > 5242880"),
    (0x7FFFFFFF, b"E_BAD_BODY IDENTIFY body too big 2147483647 > 5242880"),
])
@pytest.mark.reuse_processes
def test_e_bad_body_identify_body_size(broker, n, payload):
    w = Wire(broker)
    w.send(b"IDENTIFY\n" + size(n))
    assert_fatal(broker, w, payload)


@pytest.mark.parametrize("data, payload", [
    (b"IDENTIFY\n\x00\x00", b"E_BAD_BODY IDENTIFY failed to read body size"),
    (b"IDENTIFY\n" + size(10) + b"{}", b"E_BAD_BODY IDENTIFY failed to read body"),
    (b"MPUB t\n\x00", b"E_BAD_BODY MPUB failed to read body size"),
])
@pytest.mark.reuse_processes
def test_e_bad_body_truncated_then_eof(broker, data, payload):
    w = Wire(broker)
    w.send(data)
    w.sock.shutdown(socket.SHUT_WR)
    assert_fatal(broker, w, payload)


# -- E_BAD_BODY: MPUB -------------------------------------------------------------------


@pytest.mark.parametrize("n, payload", [
    (0, b"E_BAD_BODY MPUB invalid body size 0"),
    (-1, b"E_BAD_BODY MPUB invalid body size -1"),
    (-0x80000000, b"E_BAD_BODY MPUB invalid body size -2147483648"),
])
@pytest.mark.reuse_processes
def test_e_bad_body_mpub_invalid_body_size(broker, n, payload):
    w = Wire(broker)
    w.send(b"MPUB t\n" + size(n))
    assert_fatal(broker, w, payload)


@pytest.mark.parametrize("n, payload", [
    (MAX_BODY + 1, b"E_BAD_BODY MPUB body too big 5242881 > 5242880"),
    (0x7FFFFFFF, b"E_BAD_BODY MPUB body too big 2147483647 > 5242880"),
])
@pytest.mark.reuse_processes
def test_e_bad_body_mpub_body_too_big(broker, n, payload):
    w = Wire(broker)
    w.send(b"MPUB t\n" + size(n))
    assert_fatal(broker, w, payload)


def test_e_bad_body_mpub_body_too_big_small_limit(small_broker):
    w = Wire(small_broker)
    w.send(b"MPUB t\n" + size(1148))
    assert_fatal(small_broker, w, b"E_BAD_BODY MPUB body too big 1148 > 1000")


@pytest.mark.parametrize("count, payload", [
    (0, b"E_BAD_BODY MPUB invalid message count 0"),
    (-1, b"E_BAD_BODY MPUB invalid message count -1"),
    (1048576, b"E_BAD_BODY MPUB invalid message count 1048576"),
    (0x7FFFFFFF, b"E_BAD_BODY MPUB invalid message count 2147483647"),
])
@pytest.mark.reuse_processes
def test_e_bad_body_mpub_invalid_message_count(broker, count, payload):
    w = Wire(broker)
    w.command("MPUB t", mpub_body([b"a", b"b"], count=count))
    assert_fatal(broker, w, payload)


def test_e_bad_body_mpub_invalid_message_count_small_limit(small_broker):
    # max count = (max body size - 4) / 5 = 199
    w = Wire(small_broker)
    w.command("MPUB t", mpub_body([b"a"], count=200))
    assert_fatal(small_broker, w, b"E_BAD_BODY MPUB invalid message count 200")


def test_mpub_count_that_lies_high(broker):
    """Count 3, two messages: nsqd reads message(2)'s size from the stream (EOF here)."""
    w = Wire(broker)
    w.command("MPUB t", mpub_body([b"a", b"b"], count=3))
    w.sock.shutdown(socket.SHUT_WR)
    assert_fatal(broker, w, b"E_BAD_MESSAGE MPUB failed to read message(2) body size")


def test_mpub_count_that_lies_high_mid_size(broker):
    w = Wire(broker)
    w.command("MPUB t", mpub_body([b"a"], count=2) + b"\x00\x00")
    w.sock.shutdown(socket.SHUT_WR)
    assert_fatal(broker, w, b"E_BAD_MESSAGE MPUB failed to read message(1) body size")


def test_mpub_count_that_lies_low(broker):
    """nsqd's readMPUB reads the counted messages off the stream and never checks the
    declared body size: the bytes after them are the next command."""
    w = Wire(broker)
    w.command("MPUB t", mpub_body([b"a"], count=1) + b"ASDF\n")
    assert w.frame() == OK
    assert_fatal(broker, w, b"E_INVALID invalid command ASDF")


def test_mpub_truncated_before_count(broker):
    w = Wire(broker)
    w.send(b"MPUB t\n" + size(10) + b"\x00\x00")
    w.sock.shutdown(socket.SHUT_WR)
    assert_fatal(broker, w, b"E_BAD_BODY MPUB failed to read message count")


def test_mpub_declared_body_size_longer_than_messages(broker):
    """nsqd only range-checks the declared size: the counted messages are published."""
    w = Wire(broker)
    w.send(b"MPUB t\n" + size(100) + mpub_body([b"a", b"b"]))
    w.sock.shutdown(socket.SHUT_WR)
    assert w.frame() == OK
    assert w.rest() == b""


def test_mpub_count_is_checked_as_it_arrives(small_broker):
    """The error comes while the client still holds the declared body back."""
    w = Wire(small_broker)
    w.send(b"MPUB t\n" + size(1000) + size(200))
    assert_fatal(small_broker, w, b"E_BAD_BODY MPUB invalid message count 200")


def test_mpub_message_size_is_checked_as_it_arrives(small_broker):
    w = Wire(small_broker)
    w.send(b"MPUB t\n" + size(1000) + size(2) + size(1) + b"a" + size(101))
    assert_fatal(small_broker, w, b"E_BAD_MESSAGE MPUB message too big 101 > 100")


# -- E_BAD_TOPIC / E_BAD_CHANNEL ------------------------------------------------------


BAD_NAMES = [
    (b"a*b", b'"a*b"'),
    (b"x" * 65, b'"' + b"x" * 65 + b'"'),
    (b"x" * 55 + b"#ephemeral", b'"' + b"x" * 55 + b'#ephemeral"'),
    (b"t#ephemeral#ephemeral", b'"t#ephemeral#ephemeral"'),
    (b"#ephemeral", b'"#ephemeral"'),
    (b"", b'""'),
    (b'a"b', b'"a\\"b"'),
    (b"a\\b", b'"a\\\\b"'),
    (b"a\tb", b'"a\\tb"'),
    (b"a\x01", b'"a\\x01"'),
    (b"a\rb", b'"a\\rb"'),
    ("caf\u00e9".encode(), '"caf\u00e9"'.encode()),
    (b"a\xffb", b'"a\\xffb"'),
]
BAD_NAME_IDS = ["star", "65", "65-ephemeral", "double-ephemeral", "only-suffix", "empty",
                "quote", "backslash", "tab", "ctrl", "cr", "utf8", "invalid-utf8"]


@pytest.mark.parametrize("name, quoted", BAD_NAMES, ids=BAD_NAME_IDS)
@pytest.mark.reuse_processes
def test_e_bad_topic_pub(broker, name, quoted):
    w = Wire(broker)
    w.command(b"PUB " + name)  # checked before the body is read
    assert_fatal(broker, w, b"E_BAD_TOPIC PUB topic name " + quoted + b" is not valid")


@pytest.mark.parametrize("name, quoted", BAD_NAMES, ids=BAD_NAME_IDS)
@pytest.mark.reuse_processes
def test_e_bad_topic_sub(broker, name, quoted):
    w = Wire(broker)
    w.command(b"SUB " + name + b" ch")
    assert_fatal(broker, w, b"E_BAD_TOPIC SUB topic name " + quoted + b" is not valid")


@pytest.mark.parametrize("name, quoted", BAD_NAMES, ids=BAD_NAME_IDS)
@pytest.mark.reuse_processes
def test_e_bad_topic_mpub_doubled_code(broker, name, quoted):
    w = Wire(broker)
    w.command(b"MPUB " + name)
    assert_fatal(broker, w,
                 b"E_BAD_TOPIC E_BAD_TOPIC MPUB topic name " + quoted + b" is not valid")


@pytest.mark.parametrize("name, quoted", BAD_NAMES, ids=BAD_NAME_IDS)
@pytest.mark.reuse_processes
def test_e_bad_topic_dpub(broker, name, quoted):
    w = Wire(broker)
    w.command(b"DPUB " + name + b" abc")  # topic checked before the timeout
    assert_fatal(broker, w, b"E_BAD_TOPIC DPUB topic name " + quoted + b" is not valid")


def test_e_bad_topic_double_space(broker):
    w = Wire(broker)
    w.command("PUB  t")  # params are split on every single space: topic is ""
    assert_fatal(broker, w, b'E_BAD_TOPIC PUB topic name "" is not valid')


def test_valid_names_at_the_limit(broker):
    w = Wire(broker)
    assert w.pub("x" * 64, b"a") == OK
    assert w.pub("x" * 54 + "#ephemeral", b"a") == OK
    assert w.pub(".a-Z_9", b"a") == OK
    c = subscribed(broker, "x" * 64, "y" * 54 + "#ephemeral")
    c.close()


@pytest.mark.parametrize("name, quoted", BAD_NAMES, ids=BAD_NAME_IDS)
@pytest.mark.reuse_processes
def test_e_bad_channel(broker, name, quoted):
    w = Wire(broker)
    w.command(b"SUB t " + name)
    assert_fatal(broker, w, b"E_BAD_CHANNEL SUB channel name " + quoted + b" is not valid")


def test_e_bad_topic_checked_before_channel(broker):
    w = Wire(broker)
    w.command("SUB a*b c*d")
    assert_fatal(broker, w, b'E_BAD_TOPIC SUB topic name "a*b" is not valid')


# -- E_BAD_MESSAGE ----------------------------------------------------------------------


@pytest.mark.parametrize("cmd", ["PUB t", "DPUB t 100"])
@pytest.mark.parametrize("n", [0, -1, -0x80000000])
@pytest.mark.reuse_processes
def test_e_bad_message_invalid_body_size(broker, cmd, n):
    w = Wire(broker)
    w.send(cmd.encode() + b"\n" + size(n))
    verb = cmd.split()[0].encode()
    assert_fatal(broker, w, b"E_BAD_MESSAGE " + verb + b" invalid message body size %d" % n)


@pytest.mark.parametrize("cmd", ["PUB t", "DPUB t 100"])
@pytest.mark.reuse_processes
def test_e_bad_message_too_big_small_limit(small_broker, cmd):
    w = Wire(small_broker)
    w.command(cmd, b"x" * 101)
    verb = cmd.split()[0].encode()
    assert_fatal(small_broker, w, b"E_BAD_MESSAGE " + verb + b" message too big 101 > 100")


def test_message_of_exactly_max_size_accepted(small_broker):
    w = Wire(small_broker)
    assert w.pub("t", b"x" * 100) == OK
    assert w.mpub("t", [b"y" * 100, b"z"]) == OK


@pytest.mark.parametrize("cmd", ["PUB t", "DPUB t 100"])
@pytest.mark.reuse_processes
def test_e_bad_message_too_big_default_limit(broker, cmd):
    w = Wire(broker)
    w.send(cmd.encode() + b"\n" + size(MAX_MSG + 1))
    verb = cmd.split()[0].encode()
    assert_fatal(broker, w, b"E_BAD_MESSAGE " + verb + b" message too big 1048577 > 1048576")


@pytest.mark.parametrize("cmd", ["PUB t", "DPUB t 100"])
@pytest.mark.reuse_processes
def test_e_bad_message_truncated_body(broker, cmd):
    w = Wire(broker)
    w.send(cmd.encode() + b"\n" + size(10) + b"abc")
    w.sock.shutdown(socket.SHUT_WR)
    verb = cmd.split()[0].encode()
    assert_fatal(broker, w, b"E_BAD_MESSAGE " + verb + b" failed to read message body")


@pytest.mark.parametrize("cmd", ["PUB t", "DPUB t 100"])
@pytest.mark.reuse_processes
def test_e_bad_message_truncated_size(broker, cmd):
    w = Wire(broker)
    w.send(cmd.encode() + b"\n" + b"\x00\x00")
    w.sock.shutdown(socket.SHUT_WR)
    verb = cmd.split()[0].encode()
    assert_fatal(broker, w, b"E_BAD_MESSAGE " + verb + b" failed to read message body size")


def test_e_bad_message_mpub_message_too_big(small_broker):
    w = Wire(small_broker)
    w.command("MPUB t", mpub_body([b"a", b"x" * 101]))
    assert_fatal(small_broker, w, b"E_BAD_MESSAGE MPUB message too big 101 > 100")


def test_e_bad_message_mpub_message_too_big_default_limit(broker):
    w = Wire(broker)
    w.command("MPUB t", size(2) + size(1) + b"a" + size(0x7FFFFFFF) + b"x")
    assert_fatal(broker, w, b"E_BAD_MESSAGE MPUB message too big 2147483647 > 1048576")


@pytest.mark.parametrize("n", [0, -5])
@pytest.mark.reuse_processes
def test_e_bad_message_mpub_invalid_message_size(broker, n):
    w = Wire(broker)
    w.command("MPUB t", size(3) + size(1) + b"a" + size(1) + b"b" + size(n) + b"cc")
    assert_fatal(broker, w, b"E_BAD_MESSAGE MPUB invalid message(2) body size %d" % n)


def test_e_bad_message_mpub_truncated_message(broker):
    w = Wire(broker)
    w.command("MPUB t", size(2) + size(1) + b"a" + size(10) + b"abc")
    w.sock.shutdown(socket.SHUT_WR)
    assert_fatal(broker, w, b"E_BAD_MESSAGE MPUB failed to read message body")


def test_mpub_error_publishes_nothing(broker):
    w = Wire(broker)
    w.command("MPUB t", size(2) + size(1) + b"a" + size(0))
    assert_fatal(broker, w, b"E_BAD_MESSAGE MPUB invalid message(1) body size 0")
    c = subscribed(broker, "t", "ch", rdy=10)
    assert c.nothing(1.0)


# -- E_FIN_FAILED / E_REQ_FAILED / E_TOUCH_FAILED (non-fatal) ------------------------------


FAILED_LINES = {
    "FIN": lambda mid: b"FIN " + mid,
    "REQ": lambda mid: b"REQ " + mid + b" 0",
    "TOUCH": lambda mid: b"TOUCH " + mid,
}


@pytest.mark.parametrize("cmd", ["FIN", "REQ", "TOUCH"])
@pytest.mark.reuse_processes
def test_failed_id_not_in_flight_is_not_fatal(broker, cmd):
    w = subscribed(broker, rdy=1)
    w.command(FAILED_LINES[cmd](BOGUS_ID))
    assert w.frame() == (ERROR, b"E_%s_FAILED %s %s failed ID not in flight"
                         % (cmd.encode(), cmd.encode(), BOGUS_ID))
    assert_usable(w)
    assert not w.closed(0.3)


@pytest.mark.parametrize("cmd", ["FIN", "REQ", "TOUCH"])
def test_failed_id_not_in_flight_after_fin(broker, cmd):
    p = Wire(broker)
    assert p.pub("t", b"m") == OK
    w = subscribed(broker, rdy=1)
    _, _, mid, body = w.message()
    assert body == b"m"
    w.command(b"FIN " + mid)
    assert w.nothing(0.3)
    w.command(FAILED_LINES[cmd](mid))
    assert w.frame() == (ERROR, b"E_%s_FAILED %s %s failed ID not in flight"
                         % (cmd.encode(), cmd.encode(), mid))
    assert_usable(w)


def test_failed_id_raw_bytes_echoed(broker):
    w = subscribed(broker, rdy=1)
    mid = b"\xff" * 16
    w.command(b"FIN " + mid)
    assert w.frame() == (ERROR, b"E_FIN_FAILED FIN " + mid + b" failed ID not in flight")
    assert_usable(w)


@pytest.mark.parametrize("cmd", ["FIN", "REQ", "TOUCH"])
def test_failed_client_does_not_own_message(broker, cmd):
    p = Wire(broker)
    assert p.pub("t", b"m") == OK
    a = subscribed(broker, "t", "ch", rdy=1)
    _, attempts, mid, body = a.message()
    assert (attempts, body) == (1, b"m")
    b = subscribed(broker, "t", "ch", rdy=1)
    b.command(FAILED_LINES[cmd](mid))
    assert b.frame() == (ERROR, b"E_%s_FAILED %s %s failed client does not own message"
                         % (cmd.encode(), cmd.encode(), mid))
    assert_usable(b)
    # A still owns it and can finish it; nothing is redelivered to B
    a.command(b"FIN " + mid)
    assert a.nothing(0.5)
    assert b.nothing(1.0)


def test_touch_and_req_succeed_silently(broker):
    p = Wire(broker)
    assert p.mpub("t", [b"1", b"2"]) == OK
    w = subscribed(broker, rdy=1)
    _, _, mid, _ = w.message()
    w.command(b"TOUCH " + mid)
    assert w.nothing(0.3)
    w.command(b"REQ " + mid + b" 99999999999")  # clamped to max, never an error
    _, _, mid2, _ = w.message()  # RDY credit freed: the other message, no error frame
    assert mid2 != mid
    w.command(b"FIN " + mid2)
    assert w.nothing(1.0)  # the requeued one is deferred (clamped to 1h)


# -- E_PUB_FAILED / E_MPUB_FAILED / E_DPUB_FAILED -------------------------------------------


@pytest.mark.parametrize("line, body, prefix", [
    ("PUB t", b"m", b"E_PUB_FAILED PUB failed: "),
    ("MPUB t", mpub_body([b"a", b"b"]), b"E_MPUB_FAILED MPUB failed: "),
    ("DPUB t 1000", b"m", b"E_DPUB_FAILED DPUB failed: "),
])
def test_publish_failed_when_redis_unreachable(dead_redis_broker, line, body, prefix):
    w = Wire(dead_redis_broker, timeout=6.0)
    start = time.monotonic()
    w.command(line, body)
    frame_type, payload = w.frame()
    assert time.monotonic() - start < 5.0
    assert frame_type == ERROR
    assert payload.startswith(prefix), payload
    assert len(payload) > len(prefix)
    assert w.rest() == b""


def test_sub_failed_when_redis_unreachable(dead_redis_broker):
    w = Wire(dead_redis_broker, timeout=6.0)
    w.command("SUB t ch")
    frame_type, payload = w.frame()
    assert frame_type == ERROR
    assert payload.startswith(b"E_SUB_FAILED SUB failed: "), payload
    assert w.rest() == b""


# -- IDENTIFY ----------------------------------------------------------------------------


def test_identify_feature_negotiation_reply_exact(broker):
    w = Wire(broker)
    assert w.identify(feature_negotiation=True) == (RESPONSE, DEFAULT_IDENTIFY_REPLY)
    assert w.pub("t", b"x") == OK  # no extra frame after the JSON reply


def test_identify_reply_reflects_requested_settings(broker):
    w = Wire(broker)
    reply = w.identify(feature_negotiation=True, msg_timeout=5000, sample_rate=42,
                       output_buffer_size=1024, output_buffer_timeout=100,
                       heartbeat_interval=5000)
    expected = (DEFAULT_IDENTIFY_REPLY
                .replace(b'"msg_timeout":60000', b'"msg_timeout":5000')
                .replace(b'"sample_rate":0', b'"sample_rate":42')
                .replace(b'"output_buffer_size":16384', b'"output_buffer_size":1024')
                .replace(b'"output_buffer_timeout":250', b'"output_buffer_timeout":100'))
    assert reply == (RESPONSE, expected)
    assert list(json.loads(reply[1])) == list(json.loads(DEFAULT_IDENTIFY_REPLY))


def test_identify_reply_msg_timeout_bounds(broker):
    w = Wire(broker)
    reply = w.identify(feature_negotiation=True, msg_timeout=900000)
    assert reply == (RESPONSE, DEFAULT_IDENTIFY_REPLY.replace(b'"msg_timeout":60000',
                                                              b'"msg_timeout":900000'))


def test_identify_output_buffer_disabled(broker):
    w = Wire(broker)
    reply = w.identify(feature_negotiation=True, output_buffer_size=-1)
    assert reply == (RESPONSE, DEFAULT_IDENTIFY_REPLY
                     .replace(b'"output_buffer_size":16384', b'"output_buffer_size":1')
                     .replace(b'"output_buffer_timeout":250', b'"output_buffer_timeout":0'))


def test_identify_output_buffer_timeout_disabled(broker):
    w = Wire(broker)
    reply = w.identify(feature_negotiation=True, output_buffer_timeout=-1)
    assert reply == (RESPONSE, DEFAULT_IDENTIFY_REPLY.replace(b'"output_buffer_timeout":250',
                                                              b'"output_buffer_timeout":0'))


def test_identify_without_feature_negotiation_replies_ok(broker):
    w = Wire(broker)
    assert w.identify(client_id="c", hostname="h", user_agent="relay-tests/1",
                      msg_timeout=5000) == OK
    w2 = Wire(broker)
    assert w2.identify(feature_negotiation=False) == OK
    w3 = Wire(broker)
    w3.command("IDENTIFY", b"{}")
    assert w3.frame() == OK
    w4 = Wire(broker)
    w4.command("IDENTIFY", b"null")  # Go: unmarshalling null into a struct is a no-op
    assert w4.frame() == OK


def test_identify_unknown_fields_ignored(broker):
    w = Wire(broker)
    w.command("IDENTIFY", json.dumps({
        "feature_negotiation": True, "long_id": "x", "short_id": "y",
        "topology_zone": "z", "nested": {"a": [1, 2, {"b": None}]}, "n": 1.5,
    }).encode())
    assert w.frame() == (RESPONSE, DEFAULT_IDENTIFY_REPLY)


def test_identify_keys_case_insensitive(broker):
    """Go encoding/json matches keys case-insensitively."""
    w = Wire(broker)
    w.command("IDENTIFY", b'{"FEATURE_NEGOTIATION": true, "Msg_Timeout": 2000}')
    assert w.frame() == (RESPONSE, DEFAULT_IDENTIFY_REPLY.replace(b'"msg_timeout":60000',
                                                                  b'"msg_timeout":2000'))


def test_identify_null_fields_keep_defaults(broker):
    """Go encoding/json leaves a field unchanged for null."""
    w = Wire(broker)
    w.command("IDENTIFY", b'{"feature_negotiation": true, "msg_timeout": null, '
                          b'"heartbeat_interval": null, "client_id": null}')
    assert w.frame() == (RESPONSE, DEFAULT_IDENTIFY_REPLY)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="Go encoding/json folds keys with unicode.ToUpper(ToLower(r)), "
                   "so U+017F 'ſ' matches 's' and U+212A (Kelvin sign) matches 'k': nsqd applies "
                   "sample_rate 7; relay lowercases keys with str.lower() (ſ stays ſ), ignores the "
                   "key and replies sample_rate 0")
def test_identify_keys_unicode_case_folding(broker):
    w = Wire(broker)
    w.command("IDENTIFY", '{"feature_negotiation": true, "\u017fample_rate": 7}'.encode())
    assert w.frame() == (RESPONSE, DEFAULT_IDENTIFY_REPLY.replace(b'"sample_rate":0',
                                                                  b'"sample_rate":7'))


def test_identify_keys_unicode_case_folding_in_relay(broker):
    """relay's side of the xfail above: the key is not sample_rate, so it is ignored."""
    w = Wire(broker)
    w.command("IDENTIFY", '{"feature_negotiation": true, "\u017fample_rate": 7}'.encode())
    assert w.frame() == (RESPONSE, DEFAULT_IDENTIFY_REPLY)


def test_identify_names_not_utf8_are_taken_with_replacement_chars(processes, broker):
    """Go's encoding/json puts U+FFFD for each byte of invalid UTF-8 in a string and for
    an escaped lone surrogate, so nsqd takes such names: relay refused invalid UTF-8
    (E_BAD_BODY, a client on such a host could not connect), and a lone surrogate made
    the text /stats a 500."""
    w = Wire(broker)
    w.command("IDENTIFY", b'{"client_id": "c\xff", "hostname": "h\xe2\x82x", '
                          b'"user_agent": "u\xed\xa0\x80/\\ud800"}')
    assert w.frame() == OK
    assert w.pub("t", b"m") == OK
    assert w.sub("t", "c") == OK
    api = Api(broker, processes.http_ports[broker])
    status, stats = api.json("GET", "/stats?format=json")
    [client] = stats["topics"][0]["channels"][0]["clients"]
    [producer] = stats["producers"]
    names = ("c\ufffd", "h\ufffd\ufffdx", "u\ufffd\ufffd\ufffd/\ufffd")
    assert [tuple(c[k] for k in ("client_id", "hostname", "user_agent"))
             for c in (client, producer)] == [names, names]
    status, text, _ = api.request("GET", "/stats")
    ident = f"{names[1]}:{client['remote_address'].rpartition(':')[2]} {names[2]}"
    assert status == 200
    assert [line.split("]")[0] for line in text.decode().splitlines() if "[V2 " in line] \
        == [f"        [V2 {ident:<21}", f"   [V2 {names[0]:<21}"]


# -- heartbeats ---------------------------------------------------------------------------


def test_heartbeat_arrives(broker):
    w = Wire(broker, timeout=3.0)
    assert w.identify(heartbeat_interval=1000) == OK
    start = time.monotonic()
    assert w.frame(skip_heartbeats=False) == HEARTBEAT
    assert time.monotonic() - start < 2.0
    w.command("NOP")  # answer within 2 intervals, or the connection is closed
    assert w.frame(skip_heartbeats=False) == HEARTBEAT  # and again
    assert w.pub("t", b"x") == OK


def test_heartbeat_frame_bytes_exact(broker):
    w = Wire(broker, timeout=3.0)
    assert w.identify(heartbeat_interval=1000) == OK
    w.sock.settimeout(3.0)
    assert w.exact(19) == b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"


def test_silent_client_closed_after_two_heartbeat_intervals(broker):
    w = Wire(broker)
    assert w.identify(heartbeat_interval=1000) == OK
    start = time.monotonic()
    assert w.closed(timeout=4.0)
    elapsed = time.monotonic() - start
    assert elapsed > 1.2, f"closed after {elapsed:.2f}s, before 2 heartbeat intervals"
    assert_serving(broker)


def test_silent_subscriber_closed_after_two_heartbeat_intervals(broker):
    w = Wire(broker)
    assert w.identify(heartbeat_interval=1000) == OK
    assert w.sub("t", "ch", rdy=1) == OK
    assert w.closed(timeout=4.0)


def test_client_answering_nop_stays_open(broker):
    w = Wire(broker, timeout=3.0)
    assert w.identify(heartbeat_interval=1000) == OK
    deadline = time.monotonic() + 4.0
    beats = 0
    while time.monotonic() < deadline:
        assert w.frame(skip_heartbeats=False) == HEARTBEAT
        beats += 1
        w.command("NOP")
    assert beats >= 2
    assert w.pub("t", b"still open") == OK


# -- pipelining ------------------------------------------------------------------------------


def test_pub_pipelining(broker):
    w = Wire(broker)
    w.send(b"".join(b"PUB t\n" + size(len(b"m%02d" % i)) + b"m%02d" % i for i in range(50)))
    for _ in range(50):
        assert w.frame() == OK
    assert w.nothing(0.3)
    c = subscribed(broker, "t", "ch", rdy=50)
    got = [c.message()[3] for _ in range(50)]
    assert sorted(got) == [b"m%02d" % i for i in range(50)]


def test_pipelined_replies_keep_command_order(broker):
    w = subscribed(broker, "t", "ch", rdy=1)
    pub = b"PUB other\n" + size(1) + b"x"
    w.send(pub * 25 + b"FIN " + BOGUS_ID + b"\n" + pub * 25)
    for _ in range(25):
        assert w.frame() == OK
    assert w.frame() == (ERROR, b"E_FIN_FAILED FIN " + BOGUS_ID + b" failed ID not in flight")
    for _ in range(25):
        assert w.frame() == OK


def test_fins_in_one_packet_answer_only_the_failures_in_order(broker):
    """FINs that arrive together go to Redis as one call: the ones that took get no
    reply, each failure gets its own error frame in command order, a duplicate of a
    finished id fails as not in flight, and a PUB after them is answered after them."""
    assert Wire(broker).mpub("t", [b"%d" % i for i in range(4)]) == OK
    w = subscribed(broker, "t", "ch", rdy=4)
    mids = sorted(w.message()[2] for _ in range(4))
    fins = [mids[0], BOGUS_ID, mids[1], mids[1], mids[2], b"\xff" * 16, mids[3]]
    w.send(b"".join(b"FIN " + m + b"\r\n" * (i % 2) + b"\n" * (1 - i % 2)
                    for i, m in enumerate(fins)) + b"PUB other\n" + size(1) + b"x")
    for mid in (BOGUS_ID, mids[1], b"\xff" * 16):
        assert w.frame() == (ERROR, b"E_FIN_FAILED FIN " + mid + b" failed ID not in flight")
    assert w.frame() == OK
    assert w.nothing(0.5)


def test_a_malformed_fin_behind_good_ones_is_still_fatal(broker):
    """A FIN whose id is not 16 bytes, sent right behind valid FINs, closes the
    connection with E_INVALID as alone, after the valid ones took."""
    assert Wire(broker).mpub("t", [b"a", b"b"]) == OK
    w = subscribed(broker, "t", "ch", rdy=2)
    mids = [w.message()[2] for _ in range(2)]
    w.send(b"FIN " + mids[0] + b"\nFIN " + mids[1] + b"\nFIN " + mids[1][:15] + b"\r\n")
    assert w.frame() == (ERROR, b"E_INVALID invalid message ID")
    assert w.closed(2)
    c = subscribed(broker, "t", "ch", rdy=2)
    assert c.nothing(1.0)


def test_crlf_line_endings(broker):
    w = Wire(broker)
    w.send(b"NOP\r\nPUB t\r\n" + size(1) + b"x")
    assert w.frame() == OK


# -- hostile input ------------------------------------------------------------------------------


def test_random_bytes_after_magic(broker, processes):
    for seed in range(6):
        rnd = random.Random(seed)
        w = Wire(broker)
        for _ in range(16):
            w.send_quietly(rnd.randbytes(4096))
        w.close()
        assert_serving(broker)
    for seed in range(4):  # garbage lines of printable words
        rnd = random.Random(100 + seed)
        w = Wire(broker)
        words = [b"PUB", b"MPUB", b"DPUB", b"SUB", b"RDY", b"FIN", b"IDENTIFY", b"t", b"ch",
                 b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x00\x00\x00\x05", b"-1", b"\n"]
        w.send_quietly(b" ".join(rnd.choice(words) for _ in range(2000)))
        w.close()
        assert_serving(broker)
    assert processes.procs[0].poll() is None


@pytest.mark.parametrize("line, payload", [
    (b"PUB t", b"E_BAD_MESSAGE PUB message too big 2147483647 > 1048576"),
    (b"DPUB t 0", b"E_BAD_MESSAGE DPUB message too big 2147483647 > 1048576"),
    (b"MPUB t", b"E_BAD_BODY MPUB body too big 2147483647 > 5242880"),
    (b"IDENTIFY", b"E_BAD_BODY IDENTIFY body too big 2147483647 > 5242880"),
])
@pytest.mark.reuse_processes
def test_huge_size_header_rejected_without_reading(broker, processes, line, payload):
    w = Wire(broker)
    start = time.monotonic()
    w.send(line + b"\n" + size(0x7FFFFFFF))
    assert_fatal(broker, w, payload)
    assert time.monotonic() - start < 5.0
    assert processes.procs[0].poll() is None


def test_long_line_without_newline_closes(broker, processes):
    for prefix in (b"", b"PUB ", b"SUB t "):
        w = Wire(broker)
        w.send_quietly(prefix + b"A" * 100_000)
        assert w.rest() == b""  # closed, no error frame
        w.close()
        assert_serving(broker)
    assert processes.procs[0].poll() is None


@pytest.mark.parametrize("data, payload", [
    (b"PUB t\n" + size(-1), b"E_BAD_MESSAGE PUB invalid message body size -1"),
    (b"DPUB t 5\n" + size(-1), b"E_BAD_MESSAGE DPUB invalid message body size -1"),
    (b"MPUB t\n" + size(-1), b"E_BAD_BODY MPUB invalid body size -1"),
    (b"IDENTIFY\n" + size(-1), b"E_BAD_BODY IDENTIFY invalid body size -1"),
    (b"MPUB t\n" + size(8) + size(-1) + b"abcd", b"E_BAD_BODY MPUB invalid message count -1"),
    (b"MPUB t\n" + size(8) + size(1) + size(-7),
     b"E_BAD_MESSAGE MPUB invalid message(0) body size -7"),
])
@pytest.mark.reuse_processes
def test_negative_sizes(broker, processes, data, payload):
    w = Wire(broker)
    w.send(data)
    assert_fatal(broker, w, payload)
    assert processes.procs[0].poll() is None


def test_short_magic_then_close(broker):
    w = Wire(broker, magic=b"  V")
    w.sock.shutdown(socket.SHUT_WR)
    assert w.rest() == b""  # nsqd: short read of the magic closes without a frame
    assert_serving(broker)
