"""The NSQ V2 wire format: frames, the message layout, names (nsq internal/protocol).

A stored message record *is* the message frame payload, so delivery copies bytes:

    [8-byte big-endian ns timestamp][2-byte attempts][16-byte ASCII hex id][body]
"""

import re
import struct

MAGIC_V2 = b"  V2"

FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2

MSG_ID_LENGTH = 16
RECORD_HEADER = 8 + 2 + MSG_ID_LENGTH

OK = b"OK"
HEARTBEAT = b"_heartbeat_"
CLOSE_WAIT = b"CLOSE_WAIT"

_frame_header = struct.Struct(">ii")
_record_header = struct.Struct(">qH16s")
_size = struct.Struct(">i")
_timestamp = struct.Struct(">q")
_NAME = re.compile(r"^[.a-zA-Z0-9_-]+(#ephemeral)?$")


def frame(frame_type: int, data: bytes) -> bytes:
    """One server frame: [size = len(data) + 4][frame type][data]."""
    return _frame_header.pack(len(data) + 4, frame_type) + data


def message_frames(records) -> bytes:
    """Message frames for stored records, ready for one socket write."""
    pack = _frame_header.pack
    return b"".join(pack(len(r) + 4, FRAME_MESSAGE) + r for r in records)


def read_size(data: bytes) -> int:
    """A 4-byte big-endian signed size, as nsqd reads body lengths."""
    return _size.unpack(data)[0]


def pack_size(n: int) -> bytes:
    return _size.pack(n)


def make_record(timestamp_ns: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    return _record_header.pack(timestamp_ns, attempts, msg_id) + body


def parse_record(record: bytes):
    """(timestamp_ns, attempts, id, body) of a record or message frame payload."""
    ts, attempts, msg_id = _record_header.unpack_from(record)
    return ts, attempts, msg_id, record[RECORD_HEADER:]


def record_timestamp(record: bytes) -> int:
    return _timestamp.unpack_from(record)[0]


def record_id(record: bytes) -> bytes:
    return record[10:RECORD_HEADER]


def is_valid_name(name: str) -> bool:
    """nsqd's rule for topic and channel names: 1-64 of [.a-zA-Z0-9_-], optional #ephemeral."""
    return 1 <= len(name) <= 64 and _NAME.fullmatch(name) is not None


def is_ephemeral(name: str) -> bool:
    return name.endswith("#ephemeral")
