"""Framing of the fanout protocol: a 4-byte big-endian length, then one
serialized ``fanout.v1.Frame`` (see protocol/README.md). Every field this
client uses is in the generated code (``_proto/fanout_pb2.py``, written by
bin/protobufs from protocol/fanout.proto).
"""

from __future__ import annotations

import struct
from typing import Iterator, List, Optional, Sequence, Tuple

from google.protobuf.message import DecodeError

from ._proto import fanout_pb2 as pb
from .errors import BadFrameError, FrameTooLargeError, HTTPServerError

#: The protocol version this client speaks.
PROTOCOL_VERSION = 1
#: The default largest frame, both directions, when none is announced.
DEFAULT_MAX_FRAME_SIZE = 4 * 1024 * 1024
#: The largest Hello a daemon accepts; also the smallest frame limit that makes sense.
MAX_HELLO_SIZE = 4096
#: The largest frame size the protocol's uint32 fields can announce.
MAX_FRAME_SIZE_LIMIT = 2**32 - 1

#: Capability values (enum fanout.v1.Capability).
CAPABILITY_MEMBERS = pb.CAPABILITY_MEMBERS
CAPABILITY_BATCH = pb.CAPABILITY_BATCH

#: The longest nack delay the daemon honours (protocol.MaxNackDelay: 15 minutes).
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
        self._started = False  # a length read: HTTP is looked for only before

    def feed(self, data: bytes) -> List[pb.Frame]:
        """Adds data read from the socket; returns the frames it completes.

        Raises:
            FrameTooLargeError: a declared length above the limit.
            HTTPServerError: the stream starts with "HTTP" (read as a length,
                above 1 GiB: no first frame is that large).
            BadFrameError: an empty frame, or one that does not decode.
        """
        return [decode(body) for body in self.feed_bodies(data)]

    def feed_bodies(self, data: bytes) -> List[bytes]:
        """As feed, but returns the serialized bodies, undecoded (an empty
        one is still refused)."""
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            if not self._started:
                self._started = True
                if self._buf[:4] == b"HTTP":
                    raise HTTPServerError()
            (n,) = _LEN.unpack_from(self._buf)
            if n > self.max_size:
                raise FrameTooLargeError(n, self.max_size)
            if n == 0:
                raise BadFrameError("empty frame")
            if len(self._buf) < 4 + n:
                break
            out.append(bytes(self._buf[4 : 4 + n]))
            del self._buf[: 4 + n]
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


_BODIES = {FRAME_ACK: ("ack", pb.Ack), FRAME_NACK: ("nack", pb.Nack), FRAME_TOUCH: ("touch", pb.Touch)}


def ids_frame(
    frame_field: int,
    ids: Sequence[int],
    ranges: Sequence[Tuple[int, int]] = (),
    delay_ms: int = 0,
    reason: str = "",
    unprocessed: bool = False,
) -> bytes:
    """The serialized body of an Ack, Nack or Touch frame (frame_field
    FRAME_ACK, ...) naming ids and ranges (first, count), with a Nack's
    delay, reason and unprocessed flag."""
    name, cls = _BODIES[frame_field]
    body = cls(delivery_ids=ids, ranges=[x for r in ranges for x in r])
    if frame_field == FRAME_NACK:
        body.delay_ms, body.reason, body.unprocessed = delay_ms, reason, unprocessed
    return pb.Frame(**{name: body}).SerializeToString()


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
