"""The NSQ V2 wire codec, relay's lowest layer: frames, the message record layout,
names, MPUB bodies and nsqd's number and quoting rules (nsq internal/protocol).

A message frame's payload (a message on the wire) is

    [8-byte big-endian ns timestamp][2-byte attempts][16-byte ASCII hex id][body]

and Redis keeps a message as a stored record with the id at the end:

    [timestamp, top bit set][attempts][body][id][the id's last byte value, 0-255]

Lua 5.1 interns every string a script sees, hashing a long one from a sample of its
bytes taken from the end: ids at the head left records of equal bodies with one hash
for most body sizes, and each new one walked them all (BENCHMARKS.md). The trailing
byte spreads them over 256. parse_record and record_id read either: a stored record
(its timestamp has the mark) or a message frame's payload (delivered's, which the
broker's clients and consumers hold). Redis holds stored records only: the scripts
(scripts/lib/record.lua) and delivered read nothing else, and relay/store/layout_one.py
finds any record in the wire layout left by a release before issue 35.
"""

import re
import struct
from typing import Callable, Iterable

from relay.errors import FatalClientError

MAGIC_V2 = b"  V2"
NSQD_VERSION = "1.3.0"   # the nsqd release whose protocol and replies relay implements

FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2

MSG_ID_LENGTH = 16
MAX_PARTITIONS = 1024    # of a topic (relay/store/keys.py); its ids carry the part
MAX_PRIORITY = 9         # a message's, 0-9: its id's first digit (relay/store/keys.py)
RECORD_HEADER = 8 + 2 + MSG_ID_LENGTH
STORED = 1 << 63        # the stored record's mark, in its timestamp
STORED_TRAILER = MSG_ID_LENGTH + 1

OK = b"OK"
HEARTBEAT = b"_heartbeat_"
CLOSE_WAIT = b"CLOSE_WAIT"

_frame_header = struct.Struct(">ii")
_record_header = struct.Struct(">qH16s")
_stored_header = struct.Struct(">QH")
_stored_timestamp = struct.Struct(">Q")
_size = struct.Struct(">i")
_attempts = struct.Struct(">H")
_NAME = re.compile(r"^[.a-zA-Z0-9_-]+(#ephemeral)?$")
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)


def frame(frame_type: int, data: bytes) -> bytes:
    """One server frame: [size = len(data) + 4][frame type][data]."""
    return _frame_header.pack(len(data) + 4, frame_type) + data


def message_frames(records: Iterable[bytes]) -> bytes:
    """Message frames for stored records, ready for one socket write."""
    pack = _frame_header.pack
    return b"".join(pack(len(r) + 4, FRAME_MESSAGE) + r for r in records)


def read_size(data: bytes) -> int:
    """A 4-byte big-endian signed size, as nsqd reads body lengths."""
    return _size.unpack(data)[0]


def pack_size(n: int) -> bytes:
    return _size.pack(n)


def make_message(timestamp_ns: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """A message frame's payload."""
    return _record_header.pack(timestamp_ns, attempts, msg_id) + body


def make_record(timestamp_ns: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """A stored record (scripts/lib/record.lua's new_record writes the same)."""
    return (stored_timestamp(timestamp_ns) + _attempts.pack(attempts) + body + msg_id
            + bytes((int(msg_id[-2:], 16),)))


def stored_timestamp(timestamp_ns: int) -> bytes:
    """A stored record's first 8 bytes, as the Store gives them to publish.lua."""
    if not 0 <= timestamp_ns < STORED:
        raise struct.error(f"timestamp out of range: {timestamp_ns}")
    return _stored_timestamp.pack(timestamp_ns | STORED)


def parse_record(record: bytes) -> tuple[int, int, bytes, bytes]:
    """(timestamp_ns, attempts, id, body) of a stored record or of a message frame's
    payload."""
    ts, attempts = _stored_header.unpack_from(record)
    if ts & STORED:
        return (ts & ~STORED, attempts, record[-STORED_TRAILER:-1],
                record[10:-STORED_TRAILER])
    return ts, attempts, record[10:RECORD_HEADER], record[RECORD_HEADER:]


def record_timestamp(record: bytes) -> int:
    """The timestamp (ns) of a stored record or of a message frame's payload."""
    return _stored_timestamp.unpack_from(record)[0] & ~STORED


def record_id(record: bytes) -> bytes:
    """The id of a stored record or of a message frame's payload."""
    if record[0] & 0x80:
        return record[-STORED_TRAILER:-1]
    return record[10:RECORD_HEADER]


def delivered(record: bytes) -> bytes:
    """The message frame's payload for a stored record's delivery: the attempts Redis
    keeps count the deliveries before (scripts/deliver.lua leaves the record as it is),
    plus this one."""
    ts, attempts = _stored_header.unpack_from(record)
    return (_stored_header.pack(ts & ~STORED, min(attempts + 1, 0xFFFF))
            + record[-STORED_TRAILER:-1] + record[10:-STORED_TRAILER])


def is_valid_name(name: str) -> bool:
    """nsqd's rule for topic and channel names: 1-64 of [.a-zA-Z0-9_-], optional #ephemeral."""
    return 1 <= len(name) <= 64 and _NAME.fullmatch(name) is not None


def is_ephemeral(name: str) -> bool:
    return name.endswith("#ephemeral")


def as_text(raw: bytes) -> str:
    """Raw client bytes inside an error text; they go back on the wire unchanged."""
    return raw.decode("utf-8", "surrogateescape")


def go_quote(raw: bytes) -> str:
    """Go's %q of a byte string (strconv.Quote), as nsqd echoes bad names."""
    out = []
    text = raw.decode("utf-8", "surrogateescape")
    escapes = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f",
               "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
    for ch in text:
        if ch in escapes:
            out.append(escapes[ch])
        elif 0xDC80 <= ord(ch) <= 0xDCFF:
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x10000:
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x80 else f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def base10(raw: bytes) -> int:
    """nsq ByteToBase10: ASCII digits only, empty is 0."""
    if raw and not raw.isdigit():
        raise ValueError(raw)
    return int(raw) if raw else 0


def parse_int64(text: str) -> int:
    """Go's strconv.ParseInt(text, 10, 64), as nsqd parses HTTP arguments: an optional
    sign and ASCII digits only (Python's int() also takes spaces, '_' and other
    scripts' digits)."""
    if not _INT.fullmatch(text):
        raise ValueError(text)
    n = int(text)
    if not -2 ** 63 <= n < 2 ** 63:
        raise ValueError(text)
    return n


def int64(n: int) -> int:
    """Go's int64(uint64) of a number that wrapped at 2^64, as nsqd parses RDY."""
    n %= 2 ** 64
    return n - 2 ** 64 if n >= 2 ** 63 else n


SPLIT_TURN = 64 * 1024     # bytes of an HTTP /mpub body split between turns


def read_mpub(read: Callable[[int], bytes], max_body_size: int,
              max_msg_size: int) -> list[bytes]:
    """The messages of an MPUB body, read as nsqd's readMPUB reads them off the stream:
    read(n) gives n bytes or raises EOFError (or OSError), and each count and size is checked as it
    arrives, so a count or size that lies is an error before anything more is read."""
    try:
        count = read_size(read(4))
    except (EOFError, OSError):
        raise FatalClientError("E_BAD_BODY", "MPUB failed to read message count") from None
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise FatalClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
    messages = []
    for i in range(count):
        try:
            size = read_size(read(4))
        except (EOFError, OSError):
            raise FatalClientError("E_BAD_MESSAGE",
                                   f"MPUB failed to read message({i}) body size") from None
        if size <= 0:
            raise FatalClientError("E_BAD_MESSAGE",
                                   f"MPUB invalid message({i}) body size {size}")
        if size > max_msg_size:
            raise FatalClientError(
                "E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg_size}")
        try:
            messages.append(read(size))
        except (EOFError, OSError):
            raise FatalClientError("E_BAD_MESSAGE", "MPUB failed to read message body") from None
    return messages


def split_mpub(body: bytes, max_body_size: int, max_msg_size: int,
               turn: Callable[[], None] | None = None) -> list[bytes]:
    """The messages of an MPUB body held whole (HTTP's binary /mpub); bytes after the
    counted messages are ignored, as nsqd ignores the rest of the request body.
    `turn` is called at each SPLIT_TURN bytes (Turns.take: a million messages take
    0.5 s)."""
    pos, next_turn = 0, SPLIT_TURN

    def read(n: int) -> bytes:
        nonlocal pos, next_turn
        if pos + n > len(body):
            raise EOFError
        pos += n
        if turn is not None and pos >= next_turn:
            turn()
            next_turn = pos + SPLIT_TURN
        return body[pos - n:pos]
    return read_mpub(read, max_body_size, max_msg_size)


def split_lines(body: bytes, max_msg_size: int,
                turn: Callable[[], None] | None = None) -> list[bytes] | None:
    """The non-empty lines of a text /mpub, SPLIT_TURN bytes at a time with `turn`
    called between; None if one is longer than max_msg_size."""
    lines: list[bytes] = []
    start = 0
    while start < len(body):
        end = body.find(b"\n", start + SPLIT_TURN)
        end = len(body) if end < 0 else end
        piece = body[start:end].split(b"\n")
        if max(map(len, piece)) > max_msg_size:
            return None
        lines.extend(line for line in piece if line)
        start = end + 1
        if turn is not None:
            turn()
    return lines
