"""Unit tests of the client against the in-process fake daemon (tests/fake.py)."""

from __future__ import annotations

import threading
import time

import pytest

import fanout_client
from fanout_client import _wire, aio
from fanout_client._proto import fanout_pb2 as pb
from fake import TIMEOUT, frame_len
from flavors import FAST, THREADS, connect_bg, open_session
from rawpb import fields, varint

def test_hello_announces_the_client(flavor, daemon):
    c, conn, hello = open_session(flavor, daemon, client_id="py-1", max_in_flight=7, auth_token="s3cret", max_frame_size=65536)
    try:
        assert hello.protocol_version == 1
        assert hello.client_id == "py-1"
        assert hello.max_in_flight == 7
        assert hello.auth_token == "s3cret"
        assert hello.max_frame_size == 65536
        assert list(hello.capabilities) == [_wire.CAPABILITY_MEMBERS, _wire.CAPABILITY_BATCH]
    finally:
        c.close()


def test_without_batch_only_members_is_announced(flavor, daemon):
    c, conn, hello = open_session(flavor, daemon, batch=False)
    c.close()
    assert list(hello.capabilities) == [_wire.CAPABILITY_MEMBERS]


def test_messages_are_iterated_and_acked(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon)
    try:
        conn.deliver(11, b"hello", partition=2, offset=40, key=b"k", timestamp_ms=1_700_000_000_000,
                     headers=[pb.Header(key="h", value=b"x")])
        m = next(iter(c))
        assert (m.partition, m.offset, m.key, m.value, m.attempt, m.delivery_id) == (2, 40, b"k", b"hello", 1, 11)
        assert m.headers == [fanout_client.Header("h", b"x")]
        assert m.timestamp.year == 2023
        assert m.member == daemon.addr
        assert m.ack() is True
        assert list(conn.expect("ack").ack.delivery_ids) == [11]
        with pytest.raises(fanout_client.AlreadyAckedError):
            m.ack()
        with pytest.raises(fanout_client.AlreadyAckedError):
            m.touch()
    finally:
        c.close()


def test_a_record_without_a_key_has_key_none(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon)
    try:
        conn.deliver(1, b"none")
        conn.deliver(2, b"empty", key=b"")
        conn.deliver(3, b"k", key=b"k")
        got = [(m.value, m.key) for m in (c.get(TIMEOUT) for _ in range(3))]
        assert got == [(b"none", None), (b"empty", b""), (b"k", b"k")]
    finally:
        c.close()


def test_touch_and_plain_nack(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon)
    try:
        conn.deliver(1)
        m = c.get(TIMEOUT)
        assert m.touch() is True
        assert list(conn.expect("touch").touch.delivery_ids) == [1]
        assert m.nack() is True
        body = conn.expect_body("nack")
        f = pb.Frame.FromString(body)
        assert list(f.nack.delivery_ids) == [1]
        assert body == _wire.ids_frame(_wire.FRAME_NACK, [1])  # no delay, no reason on the wire
    finally:
        c.close()


def test_nack_with_delay_and_reason(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon)
    try:
        conn.deliver(5)
        m = c.get(TIMEOUT)
        assert m.nack(delay=2.5, reason="db down") is True
        body = conn.expect_body("nack")
        (_, _, nack), = [x for x in fields(body) if x[0] == _wire.FRAME_NACK]
        got = {num: v for num, _, v in fields(nack)}
        assert got[3] == 2500
        assert got[4] == b"db down"
        assert list(pb.Nack.FromString(nack).delivery_ids) == [5]
        with pytest.raises(ValueError):
            fanout_client.Message(0, 0, b"", b"", [], 0, 1, 1).nack(delay=-1)
    finally:
        c.close()


def test_acks_queued_together_go_in_one_frame(daemon):
    c, conn, _ = open_session(THREADS, daemon, batch=False)
    try:
        for i in range(1, 6):
            conn.deliver(i, offset=i)
        msgs = [c.get(TIMEOUT) for _ in range(5)]
        s = msgs[0]._session
        with s._lock:  # hold the writer off while all five are queued
            s._woken = True
        for m in msgs:
            m.ack()
        with s._lock:
            s._woken = False
        s.signal()
        assert sorted(conn.expect("ack").ack.delivery_ids) == [1, 2, 3, 4, 5]
    finally:
        c.close()


def test_pings_are_answered(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon)
    try:
        for nonce in (1, 300, 2**63):
            conn.send(pb.Frame(ping=pb.Ping(nonce=nonce)))
            assert conn.expect("pong", skip=()).pong.nonce == nonce
    finally:
        c.close()


def test_close_sends_queued_acks_then_goodbye(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon)
    conn.deliver(3)
    m = c.get(TIMEOUT)
    m.ack()  # queued; close sends it at the latest
    t = threading.Thread(target=c.close)
    t.start()
    assert list(conn.expect("ack").ack.delivery_ids) == [3]
    assert conn.expect("goodbye").goodbye.reason == "client closing"
    conn.close()  # the daemon closes after a Goodbye
    t.join(TIMEOUT)
    assert not t.is_alive()
    with pytest.raises(fanout_client.ClosedError):
        c.get(0)
    assert list(c) == []


def test_context_manager_closes_and_late_ack_is_refused(flavor, daemon):
    out, t = connect_bg(flavor, daemon.addr)
    conn = daemon.accept()
    conn.welcome()
    t.join(TIMEOUT)
    with out["client"] as c:
        conn.deliver(9)
        m = c.get(TIMEOUT)
    assert conn.expect("goodbye")
    with pytest.raises(fanout_client.SessionClosedError):
        m.ack()  # nothing sent: the daemon delivers it again


def test_close_with_drain_waits_for_held_messages(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon)
    conn.deliver(1)
    m = c.get(TIMEOUT)
    t = threading.Thread(target=c.close, kwargs={"drain": TIMEOUT})
    t.start()
    assert daemon.no_connection(0.3)
    assert conn.at_eof(0.3) is False  # still open: the message is held
    conn.deliver(2)  # after the drain began: not passed on, given back
    nack = conn.expect("nack").nack
    assert list(nack.delivery_ids) == [2]
    assert nack.delay_ms == 0 and nack.reason and nack.unprocessed  # not counted as a failed attempt
    assert m.ack() is True
    assert list(conn.expect("ack").ack.delivery_ids) == [1]
    assert conn.expect("goodbye")
    conn.close()
    t.join(TIMEOUT)
    assert not t.is_alive()


def test_redirect_in_handshake_is_followed(flavor, daemon, daemon2):
    out, t = connect_bg(flavor, daemon.addr)
    conn = daemon.accept()
    conn.expect("hello")
    conn.send(pb.Frame(redirect=pb.Redirect(leader_address=daemon2.addr, leader_node_id="n2", epoch=3)))
    conn2 = daemon2.accept()
    conn2.welcome()
    t.join(TIMEOUT)
    c = out["client"]
    try:
        conn2.deliver(1)
        assert c.get(TIMEOUT).member == daemon2.addr
    finally:
        c.close()


def test_redirect_after_welcome_reconnects_to_the_leader(flavor, daemon, daemon2):
    c, conn, _ = open_session(flavor, daemon)
    try:
        conn.send(pb.Frame(redirect=pb.Redirect(leader_address=daemon2.addr)))
        conn2 = daemon2.accept()
        conn2.welcome()
        conn2.deliver(4)
        assert c.get(TIMEOUT).member == daemon2.addr
    finally:
        c.close()


def test_unauthorized_fails_connect_at_once(flavor, daemon):
    out, t = connect_bg(flavor, daemon.addr)
    conn = daemon.accept()
    conn.expect("hello")
    conn.send(pb.Frame(error=pb.Error(code=pb.ERROR_CODE_UNAUTHORIZED, message="bad token", fatal=True)))
    t.join(TIMEOUT)
    err = out["error"]
    assert isinstance(err, fanout_client.ConnectError)
    assert isinstance(err.__cause__, fanout_client.RemoteError)
    assert err.__cause__.code == pb.ERROR_CODE_UNAUTHORIZED
    assert daemon.no_connection(0.3)  # not retried


def test_an_http_server_fails_connect_at_once_saying_so(flavor, daemon):
    out, t = connect_bg(flavor, daemon.addr)
    conn = daemon.accept()
    conn.expect("hello")
    conn.send_raw(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
    conn.close()
    t.join(TIMEOUT)
    err = out["error"]
    assert isinstance(err, fanout_client.ConnectError)
    assert isinstance(err.__cause__, fanout_client.HTTPServerError)
    assert str(err.__cause__) == "this is an HTTP server (the metrics and console port?), not a fanout client port"
    assert daemon.no_connection(0.3)  # not retried


def test_no_leader_waits_retry_after(flavor, daemon):
    out, t = connect_bg(flavor, daemon.addr)
    conn = daemon.accept()
    conn.expect("hello")
    t0 = time.monotonic()
    conn.send(pb.Frame(error=pb.Error(code=pb.ERROR_CODE_NO_LEADER, fatal=True, retry_after_ms=500)))
    conn.close()
    conn2 = daemon.accept()
    assert time.monotonic() - t0 >= 0.5
    conn2.welcome()
    t.join(TIMEOUT)
    out["client"].close()


def test_connect_times_out_with_the_last_error(flavor):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    addr = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()  # nobody listens
    with pytest.raises(fanout_client.ConnectError) as e:
        flavor.connect(addr, timeout=0.5, **FAST)
    assert isinstance(e.value.__cause__, ConnectionError)


def test_frame_above_the_limit_stops_the_client(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon, max_frame_size=4096)
    conn.send_raw(frame_len(4097))  # declared only: refused before the body
    with pytest.raises(fanout_client.FrameTooLargeError):
        c.get(TIMEOUT)
    with pytest.raises(fanout_client.FrameTooLargeError):
        list(c)  # the iteration raises it too
    assert isinstance(c.error, fanout_client.FrameTooLargeError)
    assert daemon.no_connection(0.3)  # permanent: no reconnect
    c.close()


@pytest.mark.parametrize("raw", [frame_len(0), frame_len(3) + b"\xff\xff\xff"], ids=["empty", "garbage"])
def test_bad_frame_ends_the_session_and_the_client_reconnects(flavor, daemon, raw):
    c, conn, _ = open_session(flavor, daemon)
    try:
        conn.deliver(1)
        m = c.get(TIMEOUT)
        conn.send_raw(raw)
        conn2 = daemon.accept()
        with pytest.raises(fanout_client.SessionClosedError):
            m.ack()  # its session ended: the daemon delivers it again
        conn2.welcome()
        conn2.deliver(2)
        assert c.get(TIMEOUT).delivery_id == 2
        assert c.error is None
    finally:
        c.close()


def test_silent_daemon_is_left(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon, welcome=dict(heartbeat_ms=100, liveness_intervals=2))
    try:
        t0 = time.monotonic()
        conn2 = daemon.accept()  # the client gave up on conn: nothing came for 3 heartbeats
        assert time.monotonic() - t0 >= 0.25
        conn2.welcome()
    finally:
        c.close()


def test_no_reconnect_gives_up(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon, reconnect=False)
    conn.close()
    with pytest.raises(fanout_client.ConnectionLostError):
        c.get(TIMEOUT)
    assert daemon.no_connection(0.3)
    c.close()


def test_deliver_batch_and_ranges_when_confirmed(daemon):
    # Welcome.capabilities = [CAPABILITY_BATCH] (field 11), as the daemon sends it.
    c, conn, hello = open_session(THREADS, daemon, welcome=dict(max_in_flight=64))
    try:
        assert _wire.CAPABILITY_BATCH in hello.capabilities
        s = c.get(0.2)  # nothing yet
        assert s is None
        # The daemon confirmed nothing: ids only.
        conn.send_raw(_batch_frame([pb.Deliver(delivery_id=i, offset=i, attempt=1) for i in (1000, 1001)]))
        a, b = c.get(TIMEOUT), c.get(TIMEOUT)
        assert (a.delivery_id, b.delivery_id, b.offset) == (1000, 1001, 1001)
        a.ack(), b.ack()
        ids = []
        while len(ids) < 2:
            f = conn.expect("ack")
            ids += f.ack.delivery_ids
        assert sorted(ids) == [1000, 1001]
    finally:
        c.close()

    out, t = connect_bg(THREADS, daemon.addr)
    conn = daemon.accept()
    conn.expect("hello")
    welcome = pb.Frame(welcome=pb.Welcome(max_in_flight=64, heartbeat_ms=60_000)).SerializeToString()
    conn.send_raw(_add_welcome_caps(welcome, [_wire.CAPABILITY_BATCH]))
    t.join(TIMEOUT)
    c = out["client"]
    try:
        conn.send_raw(_batch_frame([pb.Deliver(delivery_id=i, attempt=1) for i in range(2000, 2010)]))
        msgs = [c.get(TIMEOUT) for _ in range(10)]
        s = msgs[0]._session
        assert s.state.ranges
        with s._lock:
            s._woken = True  # queue all ten before the writer runs
        for m in msgs:
            m.ack()
        with s._lock:
            s._woken = False
        s.signal()
        body = conn.expect_body("ack")
        (_, _, ack), = [x for x in fields(body) if x[0] == _wire.FRAME_ACK]
        assert [(n, v) for n, _, v in fields(ack)] == [(2, varint(2000) + varint(10))]
    finally:
        c.close()


def _batch_frame(ds):
    inner = b"".join(b"\x0a" + varint(len(d.SerializeToString())) + d.SerializeToString() for d in ds)
    body = b"\x6a" + varint(len(inner)) + inner
    return frame_len(len(body)) + body


def _add_welcome_caps(frame_body: bytes, caps):
    (num, _, welcome), = list(fields(frame_body))
    packed = b"".join(varint(c) for c in caps)
    welcome = welcome + b"\x5a" + varint(len(packed)) + packed
    body = b"\x12" + varint(len(welcome)) + welcome
    return frame_len(len(body)) + body


def test_members_one_session_each_with_split_credit(flavor, daemon, daemon2):
    both = [pb.Member(address=daemon.addr), pb.Member(address=daemon2.addr)]
    c, conn, hello = open_session(flavor, daemon, max_in_flight=10, welcome=dict(members=both))
    try:
        assert hello.max_in_flight == 10
        # The first session asked for all the credit: it is opened again with its share, once drained.
        conn2 = daemon2.accept()
        h2 = conn2.welcome(members=both)
        assert h2.max_in_flight == 5
        assert conn.expect("goodbye").goodbye.reason == "session retired"
        conn.close()
        conn1 = daemon.accept()
        h1 = conn1.welcome(members=both)
        assert h1.max_in_flight == 5
        assert c.members == sorted([daemon.addr, daemon2.addr])
        conn1.deliver(1, b"a")
        conn2.deliver(1, b"b")
        msgs = [c.get(TIMEOUT) for _ in range(2)]
        assert {m.member for m in msgs} == {daemon.addr, daemon2.addr}
        held = [m for m in msgs if m.member == daemon2.addr][0]
        conn2.deliver(3, b"queued", offset=3)  # not taken before the session retires
        # daemon2 leaves the list: its session is retired, the other gets all the credit.
        conn1.send(pb.Frame(members=pb.Members(members=[pb.Member(address=daemon.addr)])))
        # What the retiring session does not pass on (queued, or delivered
        # from now on) is given back at once, not left in flight until the
        # daemon's ack timeout.
        nack = conn2.expect("nack").nack
        assert list(nack.delivery_ids) == [3] and nack.unprocessed
        conn2.deliver(2, b"late", offset=2)
        assert list(conn2.expect("nack").nack.delivery_ids) == [2]
        # The same record back (nobody else had room): held, not bounced.
        conn2.deliver(4, b"late", offset=2)
        conn2.deliver(5, b"later", offset=5)
        assert list(conn2.expect("nack").nack.delivery_ids) == [5]
        assert conn2.at_eof(0.3) is False  # it waits for its message to be acked
        assert held.ack() is True
        assert list(conn2.expect("ack").ack.delivery_ids) == [1]
        assert conn2.expect("goodbye").goodbye.reason == "session retired"
        conn2.close()
        assert c.members == [daemon.addr]
    finally:
        c.close()


def test_older_member_list_changes_nothing(flavor, daemon, daemon2):
    """Members may disagree for a moment while an assignment spreads: a list
    of a lower (epoch, generation), or without one in a Members frame, is
    ignored; a newer one is followed."""
    both = [pb.Member(address=daemon.addr), pb.Member(address=daemon2.addr)]
    one = [pb.Member(address=daemon.addr)]
    v = pb.MembersVersion
    c, conn, _ = open_session(flavor, daemon, max_in_flight=10, welcome=dict(members=both, members_version=v(epoch=2, generation=5)))
    try:
        conn2 = daemon2.accept()
        conn2.welcome(members=both, members_version=v(epoch=2, generation=5))
        assert conn.expect("goodbye").goodbye.reason == "session retired"
        conn.close()
        conn1 = daemon.accept()
        conn1.welcome(members=both, members_version=v(epoch=2, generation=5))

        def synced(cn, nonce):
            # The session's reader follows a list before it reads the next frame.
            cn.send(pb.Frame(ping=pb.Ping(nonce=nonce)))
            assert cn.expect("pong", skip=()).pong.nonce == nonce

        conn2.send(pb.Frame(members=pb.Members(members=one, version=v(epoch=2, generation=4))))
        synced(conn2, 1)
        conn1.send(pb.Frame(members=pb.Members(members=one)))
        synced(conn1, 2)
        assert c.members == sorted([daemon.addr, daemon2.addr])
        conn2.deliver(1, b"still here")
        assert c.get(TIMEOUT).value == b"still here"

        conn2.send(pb.Frame(members=pb.Members(members=one, version=v(epoch=3, generation=1))))
        synced(conn2, 3)
        assert c.members == [daemon.addr]
    finally:
        c.close()


@pytest.mark.parametrize("cls", [fanout_client.Client, aio.Client], ids=["threads", "asyncio"])
def test_bad_arguments_are_refused(cls):
    with pytest.raises(ValueError):
        cls([])
    with pytest.raises(ValueError):
        cls("no-port")
    with pytest.raises(ValueError):
        cls("h:1", max_in_flight=0)
    with pytest.raises(ValueError):
        cls("h:1", max_frame_size=10)


@pytest.fixture
def tls(tmp_path):
    """A server context with a certificate for 127.0.0.1 and a client context trusting it."""
    import shutil
    import ssl
    import subprocess

    openssl = shutil.which("openssl")
    assert openssl, "openssl is needed to make the test certificate"
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))


def test_tls_session(flavor, tls):
    from fake import FakeDaemon
    import ssl

    server, client_ctx = tls
    d = FakeDaemon(server)
    try:
        c, conn, hello = open_session(flavor, d, ssl_context=client_ctx)
        try:
            assert isinstance(conn.sock, ssl.SSLSocket)
            for i in range(1, 4):
                conn.deliver(i, b"x" * 100_000, offset=i)  # larger than one TLS record
            conn.send(pb.Frame(ping=pb.Ping(nonce=7)))
            msgs = [c.get(TIMEOUT) for _ in range(3)]
            assert [m.value for m in msgs] == [b"x" * 100_000] * 3
            assert conn.expect("pong", skip=()).pong.nonce == 7
            for m in msgs:
                m.ack()
            ids = []
            while len(ids) < 3:
                f = conn.expect("ack")
                ids += f.ack.delivery_ids
            assert sorted(ids) == [1, 2, 3]
        finally:
            c.close()
        # A client that does not trust the certificate does not get in.
        with pytest.raises(fanout_client.ConnectError):
            flavor.connect(d.addr, ssl_context=ssl.create_default_context(), timeout=1, **FAST)
    finally:
        d.close()
