"""The framing and the frames the client builds against protocol/README.md's worked examples."""

import pytest

from fanout_client import BadFrameError, FrameTooLargeError, _wire
from fanout_client._proto import fanout_pb2 as pb


def h(s):
    return bytes.fromhex(s.replace(" ", ""))


def test_worked_examples():
    assert _wire.encode(pb.Frame(ping=pb.Ping(nonce=1)), 100) == h("00000004 42 02 08 01")
    assert _wire.encode(pb.Frame(ping=pb.Ping(nonce=300)), 100) == h("00000005 42 03 08 ac 02")
    assert _wire.prefix(_wire.ids_frame(_wire.FRAME_ACK, [1, 2, 3]), 100) == h("00000007 2a 05 0a 03 01 02 03")
    hello = pb.Frame(hello=pb.Hello(protocol_version=1, capabilities=[1, 2]))
    assert _wire.encode(hello, 100) == h("00000008 0a 06 10 01 32 02 01 02")


def test_ids_frame_matches_the_generated_code():
    for field, name in ((_wire.FRAME_ACK, "ack"), (_wire.FRAME_NACK, "nack"), (_wire.FRAME_TOUCH, "touch")):
        ids = [1, 127, 128, 2**32, 2**64 - 1]
        f = pb.Frame(**{name: getattr(pb, name.capitalize())(delivery_ids=ids)})
        assert _wire.ids_frame(field, ids) == f.SerializeToString()


def test_nack_fields_match_the_generated_code():
    f = pb.Frame(nack=pb.Nack(delivery_ids=[7], delay_ms=1000, reason="busy", unprocessed=True))
    assert _wire.ids_frame(_wire.FRAME_NACK, [7], (), 1000, "busy", True) == f.SerializeToString()
    f = pb.Frame(nack=pb.Nack(delivery_ids=[7], unprocessed=True))
    assert _wire.ids_frame(_wire.FRAME_NACK, [7], unprocessed=True) == f.SerializeToString()


def test_ranges_of_protocol_readme():
    # protocol/README.md: Ack{ranges: [1000, 250]} and Ack{delivery_ids: [5], ranges: [1000, 2]}.
    assert _wire.prefix(_wire.ids_frame(_wire.FRAME_ACK, [], [(1000, 250)]), 100) == h("00000008 2a 06 12 04 e8 07 fa 01")
    assert _wire.prefix(_wire.ids_frame(_wire.FRAME_ACK, [5], [(1000, 2)]), 100) == h("0000000a 2a 08 0a 01 05 12 03 e8 07 02")
    assert _wire.ranges_of([7, 1000, 1001, 5, 3, 4]) == ([7], [(3, 3), (1000, 2)])


def test_split_ids_counts_range_ids():
    parts = list(_wire.split_ids(list(range(10, 20)) + [30], 4, True))
    assert all(len(i) + sum(n for _, n in r) <= 4 for i, r in parts)
    named = sorted([x for i, r in parts for x in i] + [a + k for _, r in parts for a, n in r for k in range(n)])
    assert named == list(range(10, 20)) + [30]
    assert list(_wire.split_ids([1, 2, 3], 2, False)) == [([1, 2], []), ([3], [])]


def test_deliver_batch_of_protocol_readme():
    b = h("6a 1e 0a 0d 08 e8 07 10 02 18 07 2a 02 68 69 40 01 0a 0d 08 e9 07 10 02 18 08 2a 02 79 6f 40 01")
    f = _wire.decode(b)
    assert f.WhichOneof("body") == "deliver_batch"
    ds = f.deliver_batch.deliveries
    assert [(d.delivery_id, d.partition, d.offset, d.value, d.attempt) for d in ds] == [
        (1000, 2, 7, b"hi", 1), (1001, 2, 8, b"yo", 1)]


def test_welcome_capabilities_packed_and_not():
    assert list(_wire.decode(h("12 03 5a 01 02")).welcome.capabilities) == [_wire.CAPABILITY_BATCH]
    assert list(_wire.decode(h("12 04 58 02 58 01")).welcome.capabilities) == [2, 1]
    assert list(_wire.decode(h("12 02 08 01")).welcome.capabilities) == []


def test_reader_checks_the_length_before_the_body():
    r = _wire.FrameReader(10)
    with pytest.raises(FrameTooLargeError):
        r.feed(h("0000000b"))
    r = _wire.FrameReader(100)
    with pytest.raises(BadFrameError):
        r.feed(h("00000000"))
    with pytest.raises(BadFrameError):
        _wire.FrameReader(100).feed(h("00000003 ff ff ff"))


def test_reader_splits_and_joins_frames():
    data = _wire.encode(pb.Frame(ping=pb.Ping(nonce=1)), 100) * 2
    r = _wire.FrameReader(100)
    got = []
    for i in range(len(data)):
        got += r.feed(data[i : i + 1])
    assert [f.ping.nonce for f in got] == [1, 1]
    assert [f.ping.nonce for f in _wire.FrameReader(100).feed(data)] == [1, 1]
    assert _wire.FrameReader(100).feed_bodies(data) == [h("42 02 08 01")] * 2
