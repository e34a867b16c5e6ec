"""The NSQ V2 wire codec: names, frames and message records, byte for byte."""

import struct

import pytest

from relay import codec
from relay.codec import (CLOSE_WAIT, FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE,
                         HEARTBEAT, MAGIC_V2, OK, RECORD_HEADER, delivered, frame,
                         is_ephemeral, is_valid_name, make_message, make_record,
                         message_frames, pack_size, parse_record, read_size, record_id,
                         record_timestamp, stored_timestamp)


# -- names (nsq internal/protocol IsValidTopicName / IsValidChannelName) -------------

@pytest.mark.parametrize("name", [
    "a",
    "Z",
    "0",
    ".",
    "-",
    "_",
    "topic",
    "My.Topic-name_01",
    "a" * 64,
    "a#ephemeral",
    "x" * 54 + "#ephemeral",          # 64 with the suffix
    "..--__",
])
def test_valid_names(name):
    assert is_valid_name(name)


@pytest.mark.parametrize("name", [
    "",
    "a" * 65,
    "x" * 55 + "#ephemeral",          # 65 with the suffix
    "#ephemeral",
    "a#ephemeral#ephemeral",
    "a#Ephemeral",
    "a#eph",
    "a#",
    "#",
    "a b",
    " a",
    "a ",
    "a/b",
    "a:b",
    "a*",
    "a,b",
    "a\tb",
    "a\x00",
    "a\r",
    "\na",
    "tópico",
    "日本",
    "naïve",
    "１２３",                          # fullwidth digits
    "\u0430",                          # Cyrillic a
    "é" * 32,
])
def test_invalid_names(name):
    assert not is_valid_name(name)


@pytest.mark.parametrize("name", ["a\n", "a#ephemeral\n"])
def test_trailing_newline_is_not_a_valid_name(name):
    assert not is_valid_name(name)


def test_latin1_decoded_bytes_are_invalid():
    """The handlers decode names as latin-1: any non-ASCII byte must be rejected."""
    for byte in range(0x80, 0x100):
        assert not is_valid_name("a" + bytes([byte]).decode("latin-1"))


def test_is_ephemeral():
    assert is_ephemeral("t#ephemeral")
    assert not is_ephemeral("t")
    assert not is_ephemeral("t#ephemeral.x")
    assert not is_ephemeral("ephemeral")


# -- frames --------------------------------------------------------------------

def test_constants():
    assert MAGIC_V2 == b"  V2"
    assert (FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE) == (0, 1, 2)
    assert OK == b"OK"
    assert HEARTBEAT == b"_heartbeat_"
    assert CLOSE_WAIT == b"CLOSE_WAIT"
    assert RECORD_HEADER == 26 == codec.MSG_ID_LENGTH + 10


def test_response_frame_bytes():
    assert frame(FRAME_RESPONSE, OK) == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert frame(FRAME_RESPONSE, HEARTBEAT) == (
        b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_")
    assert frame(FRAME_RESPONSE, CLOSE_WAIT) == (
        b"\x00\x00\x00\x0e\x00\x00\x00\x00CLOSE_WAIT")


def test_error_frame_bytes():
    data = b"E_INVALID invalid command"
    assert frame(FRAME_ERROR, data) == b"\x00\x00\x00\x1d\x00\x00\x00\x01" + data


def test_empty_and_large_frames():
    assert frame(FRAME_RESPONSE, b"") == b"\x00\x00\x00\x04\x00\x00\x00\x00"
    big = b"x" * 70_000
    out = frame(FRAME_MESSAGE, big)
    assert out[:8] == b"\x00\x01\x11\x74\x00\x00\x00\x02"
    assert out[8:] == big


def test_message_frames():
    r1 = make_message(1, 1, b"0000000000000001", b"hello")
    r2 = make_message(2, 3, b"0000000000000002", b"")
    out = message_frames([r1, r2])
    assert out == (struct.pack(">ii", len(r1) + 4, 2) + r1
                   + struct.pack(">ii", len(r2) + 4, 2) + r2)
    assert out[:8] == b"\x00\x00\x00\x23\x00\x00\x00\x02"   # 26 + 5 + 4 = 35
    assert message_frames(r for r in [r1]) == frame(FRAME_MESSAGE, r1)
    assert message_frames([]) == b""


def test_sizes():
    assert read_size(b"\x00\x00\x01\x00") == 256
    assert read_size(b"\x7f\xff\xff\xff") == 2**31 - 1
    assert read_size(b"\xff\xff\xff\xff") == -1     # signed, as nsqd reads it
    assert read_size(b"\x80\x00\x00\x00") == -2**31
    assert pack_size(5) == b"\x00\x00\x00\x05"
    assert read_size(pack_size(123456)) == 123456
    with pytest.raises(struct.error):
        read_size(b"\x00\x00\x01")


# -- records -------------------------------------------------------------------

def test_message_and_stored_record_layouts():
    message = make_message(0x0102030405060708, 0x0A0B, b"0123456789abcdef", b"body")
    assert message == (bytes.fromhex("0102030405060708") + b"\x0a\x0b"
                       + b"0123456789abcdef" + b"body")
    record = make_record(0x0102030405060708, 0x0A0B, b"0123456789abcdef", b"body")
    assert record == (bytes.fromhex("8102030405060708") + b"\x0a\x0b" + b"body"
                      + b"0123456789abcdef" + b"\xef")
    assert record_id(message) == record_id(record) == b"0123456789abcdef"
    assert record_timestamp(message) == record_timestamp(record) == 0x0102030405060708
    assert stored_timestamp(0x0102030405060708) == record[:8]


@pytest.mark.parametrize("ts, attempts, msg_id, body", [
    (0, 0, b"0000000000000000", b""),
    (1_700_000_000_123_456_789, 1, b"00000000000000ff", b"hello"),
    (2**63 - 1, 65535, b"ffffffffffffffff", bytes(range(256)) * 4),
    (7, 2, b"0123456789abcdef", b"\x00\n\r\n"),
])
def test_parse_record_round_trip(ts, attempts, msg_id, body):
    record = make_record(ts, attempts, msg_id, body)
    assert len(record) == RECORD_HEADER + 1 + len(body)
    assert parse_record(record) == (ts, attempts, msg_id, body)
    assert record_id(record) == msg_id
    # a message frame's payload (the wire layout)
    message = make_message(ts, attempts, msg_id, body)
    assert parse_record(frame(FRAME_MESSAGE, message)[8:]) == (ts, attempts, msg_id, body)
    assert record_id(message) == msg_id


def test_delivered_sends_a_record_as_a_message_with_its_delivery_counted():
    assert delivered(make_record(9, 0, b"00000000000000a1", b"hi")) == \
        make_message(9, 1, b"00000000000000a1", b"hi")
    assert delivered(make_record(9, 65535, b"00000000000000a1", b"")) == \
        make_message(9, 65535, b"00000000000000a1", b"")


def test_parse_record_accepts_memoryview_and_rejects_short():
    record = make_message(5, 1, b"000000000000000a", b"xyz")
    assert parse_record(memoryview(record))[:3] == (5, 1, b"000000000000000a")
    assert bytes(parse_record(memoryview(record))[3]) == b"xyz"
    with pytest.raises(struct.error):
        parse_record(record[:9])


def test_make_record_limits():
    with pytest.raises(struct.error):
        make_record(0, 65536, b"0" * 16, b"")
    with pytest.raises(struct.error):
        make_record(2**63, 0, b"0" * 16, b"")
    with pytest.raises(struct.error):
        make_record(-1, 0, b"0" * 16, b"")
