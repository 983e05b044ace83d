"""Framing of the fanout protocol: a 4-byte big-endian length, then one
serialized ``fanout.v1.Frame`` (see protocol/README.md).

Two features of the protocol are not yet in the generated code, which
follows protocol/fanout.proto of this checkout: a Nack's delay and reason
(fields 3 and 4, issue 12) and batches (the Hello capability
CAPABILITY_BATCH = 2, DeliverBatch as Frame field 13, Welcome.capabilities
as field 11, and id ranges as field 2 of Ack, Nack and Touch, issue 13).
This module encodes and decodes those fields by hand, from the wire format
the drafts define; the generated code replaces them once the schema has
them.
"""

from __future__ import annotations

import struct
from typing import Iterator, List, Optional, Sequence, Tuple

from google.protobuf.message import DecodeError

from ._proto import fanout_pb2 as pb
from .errors import BadFrameError, FrameTooLargeError

#: The protocol version this client speaks.
PROTOCOL_VERSION = 1
#: The default largest frame, both directions, when none is announced.
DEFAULT_MAX_FRAME_SIZE = 4 * 1024 * 1024
#: The largest Hello a daemon accepts; also the smallest frame limit that makes sense.
MAX_HELLO_SIZE = 4096
#: The largest frame size the protocol's uint32 fields can announce.
MAX_FRAME_SIZE_LIMIT = 2**32 - 1

#: Capability values (enum fanout.v1.Capability).
CAPABILITY_MEMBERS = 1
#: Not yet in the generated code (issue 13's draft).
CAPABILITY_BATCH = 2

# Field numbers of the drafts (see the module's doc).
_FRAME_DELIVER_BATCH = 13
_WELCOME_CAPABILITIES = 11
_IDS_RANGES = 2
_NACK_DELAY_MS = 3
_NACK_REASON = 4
_NACK_UNPROCESSED = 5
#: The longest nack delay the daemon honours (issue 12: 15 minutes).
MAX_NACK_DELAY_MS = 900_000

_LEN = struct.Struct(">I")

# Bounds the ids of one Ack, Nack or Touch frame (the Go client's limit).
_MAX_IDS_PER_FRAME = 4096

# Frame fields of Ack, Nack and Touch.
FRAME_ACK, FRAME_NACK, FRAME_TOUCH = 5, 6, 7


def encode(frame: pb.Frame, max_size: int) -> bytes:
    """Returns frame with its length prefix, refusing a frame above max_size."""
    return prefix(frame.SerializeToString(), max_size)


def prefix(body: bytes, max_size: int) -> bytes:
    """Returns the serialized frame body with its length prefix, refusing
    one above max_size."""
    if len(body) > max_size:
        raise FrameTooLargeError(len(body), max_size, "to the daemon")
    return _LEN.pack(len(body)) + body


class FrameReader:
    """Splits a byte stream into frames. It checks each declared length
    against the limit before buffering the frame's body, so a peer cannot
    make it hold more than one frame of max_size bytes."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._buf = bytearray()

    def feed(self, data: bytes) -> List[Tuple[pb.Frame, bytes]]:
        """Adds data read from the socket; returns the frames it completes,
        each with its serialized body (for the fields decoded by hand).

        Raises:
            FrameTooLargeError: a declared length above the limit.
            BadFrameError: an empty frame, or one that does not decode.
        """
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            (n,) = _LEN.unpack_from(self._buf)
            if n > self.max_size:
                raise FrameTooLargeError(n, self.max_size)
            if n == 0:
                raise BadFrameError("empty frame")
            if len(self._buf) < 4 + n:
                break
            body = bytes(self._buf[4 : 4 + n])
            del self._buf[: 4 + n]
            out.append((decode(body), body))
        return out


def decode(body: bytes) -> pb.Frame:
    """Decodes one frame body; BadFrameError when it does not decode."""
    f = pb.Frame()
    try:
        f.ParseFromString(body)
    except DecodeError as e:
        raise BadFrameError(f"frame of {len(body)} bytes does not decode: {e}") from e
    return f


def ids_per_frame(max_frame: int, max_in_flight: int) -> int:
    """How many delivery ids one Ack, Nack or Touch frame may carry under a
    frame limit of max_frame bytes (an id takes at most 10 bytes, the frame's
    tags and lengths, with a nack's delay and reason, fewer than 16 + 300) and
    the Welcome's in-flight limit, which the daemon allows no frame to pass
    (0: none told)."""
    if max_frame <= 0:
        max_frame = DEFAULT_MAX_FRAME_SIZE
    n = min(_MAX_IDS_PER_FRAME, (max_frame - 16 - 300) // 10)
    if max_in_flight > 0:
        n = min(n, max_in_flight)
    return max(1, n)


# ------------------------------------------------------------------ raw protobuf


def _varint(v: int) -> bytes:
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _read_varint(buf: bytes, i: int) -> Tuple[int, int]:
    v = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise BadFrameError("truncated or overlong varint")
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v, i
        shift += 7


def fields(buf: bytes) -> Iterator[Tuple[int, int, object]]:
    """Yields (field number, wire type, value) of a serialized message: an
    int for varints and fixed fields, bytes for length-delimited ones."""
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _read_varint(buf, i)
            yield num, wt, v
        elif wt == 2:
            n, i = _read_varint(buf, i)
            if i + n > len(buf):
                raise BadFrameError("truncated field")
            yield num, wt, buf[i : i + n]
            i += n
        elif wt == 1:
            if i + 8 > len(buf):
                raise BadFrameError("truncated field")
            yield num, wt, int.from_bytes(buf[i : i + 8], "little")
            i += 8
        elif wt == 5:
            if i + 4 > len(buf):
                raise BadFrameError("truncated field")
            yield num, wt, int.from_bytes(buf[i : i + 4], "little")
            i += 4
        else:
            raise BadFrameError(f"wire type {wt} not supported")


def _packed(wt: int, v: object) -> List[int]:
    """The varints of a repeated field occurrence, packed or not."""
    if wt == 0:
        return [v]  # type: ignore[list-item]
    if wt != 2:
        raise BadFrameError("repeated varint field of wire type %d" % wt)
    out, i, b = [], 0, v
    assert isinstance(b, bytes)
    while i < len(b):
        x, i = _read_varint(b, i)
        out.append(x)
    return out


def deliver_batch(body: bytes) -> Optional[List[pb.Deliver]]:
    """The deliveries of a DeliverBatch frame body, or None when body is not
    one (Frame field 13: a frame the generated code does not know)."""
    found = None
    for num, wt, v in fields(body):
        if num == _FRAME_DELIVER_BATCH and wt == 2:
            found = [] if found is None else found
            for n2, wt2, d in fields(v):  # type: ignore[arg-type]
                if n2 == 1 and wt2 == 2:
                    dl = pb.Deliver()
                    try:
                        dl.ParseFromString(d)  # type: ignore[arg-type]
                    except DecodeError as e:
                        raise BadFrameError(f"DeliverBatch: a delivery does not decode: {e}") from e
                    found.append(dl)
    return found


def welcome_capabilities(body: bytes) -> List[int]:
    """Welcome.capabilities (field 11) of a Welcome frame's body."""
    caps: List[int] = []
    for num, wt, v in fields(body):
        if num == 2 and wt == 2:
            for n2, wt2, c in fields(v):  # type: ignore[arg-type]
                if n2 == _WELCOME_CAPABILITIES:
                    caps.extend(_packed(wt2, c))
    return caps


def ranges_of(ids: Sequence[int]) -> Tuple[List[int], List[Tuple[int, int]]]:
    """Splits ids into single ids and ranges (first, count) of two or more
    consecutive ids, in ascending order."""
    single: List[int] = []
    ranges: List[Tuple[int, int]] = []
    s = sorted(ids)
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        if j > i:
            ranges.append((s[i], j - i + 1))
        else:
            single.append(s[i])
        i = j + 1
    return single, ranges


def ids_frame(
    frame_field: int,
    ids: Sequence[int],
    ranges: Sequence[Tuple[int, int]] = (),
    delay_ms: int = 0,
    reason: str = "",
    unprocessed: bool = False,
) -> bytes:
    """The body of an Ack, Nack or Touch frame (frame_field FRAME_ACK, ...)
    naming ids and ranges, with a Nack's delay, reason and unprocessed flag;
    the bytes the generated code writes for the fields it knows."""
    inner = bytearray()
    if ids:
        packed = b"".join(_varint(i) for i in ids)
        inner += b"\x0a" + _varint(len(packed)) + packed
    if ranges:
        packed = b"".join(_varint(a) + _varint(n) for a, n in ranges)
        inner += bytes([(_IDS_RANGES << 3) | 2]) + _varint(len(packed)) + packed
    if delay_ms:
        inner += bytes([(_NACK_DELAY_MS << 3) | 0]) + _varint(delay_ms)
    if reason:
        r = reason.encode("utf-8")
        inner += bytes([(_NACK_REASON << 3) | 2]) + _varint(len(r)) + r
    if unprocessed:
        inner += bytes([(_NACK_UNPROCESSED << 3) | 0, 1])
    return bytes([(frame_field << 3) | 2]) + _varint(len(inner)) + bytes(inner)


def split_ids(
    ids: Sequence[int], max_ids: int, use_ranges: bool
) -> Iterator[Tuple[List[int], List[Tuple[int, int]]]]:
    """Splits ids into the (ids, ranges) of frames naming at most max_ids ids
    each (a range counts its ids); ranges only with use_ranges."""
    if use_ranges:
        single, ranges = ranges_of(ids)
    else:
        single, ranges = list(ids), []
    cur_ids: List[int] = []
    cur_ranges: List[Tuple[int, int]] = []
    room = max_ids
    for i in single:
        cur_ids.append(i)
        room -= 1
        if room == 0:
            yield cur_ids, cur_ranges
            cur_ids, cur_ranges, room = [], [], max_ids
    for first, n in ranges:
        while n > 0:
            take = min(n, room)
            if take == 1:
                cur_ids.append(first)
            else:
                cur_ranges.append((first, take))
            first, n, room = first + take, n - take, room - take
            if room == 0:
                yield cur_ids, cur_ranges
                cur_ids, cur_ranges, room = [], [], max_ids
    if cur_ids or cur_ranges:
        yield cur_ids, cur_ranges


def members_version(msg: object, field: str) -> Optional[Tuple[int, int]]:
    """The (epoch, generation) of a Welcome's or Members frame's member
    list (MembersVersion), or None when the frame has none."""
    if not msg.HasField(field):  # type: ignore[attr-defined]
        return None
    v = getattr(msg, field)
    return (v.epoch, v.generation)
