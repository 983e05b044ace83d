"""consume, of both clients, against the in-process fake daemon: a fixed set
of workers, each message acked or nacked by its handler's outcome, a clean
stop that drains."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import fanout_client
from fanout_client import aio
from fanout_client._proto import fanout_pb2 as pb
from fake import TIMEOUT, frame_len
from flavors import FAST, open_session


def settled(conn, n):
    """Reads the acks and nacks of the client until n ids are named: {id: ("ack",) or ("nack", delay, reason, unprocessed)}."""
    got = {}
    while len(got) < n:
        f = conn.expect_any(("ack", "nack"))
        kind = f.WhichOneof("body")
        if kind == "ack":
            for i in f.ack.delivery_ids:
                assert i not in got, f"{i} settled twice: {got[i]} and ack"
                got[i] = ("ack",)
        else:
            for i in f.nack.delivery_ids:
                assert i not in got, f"{i} settled twice: {got[i]} and nack"
                got[i] = ("nack", f.nack.delay_ms, f.nack.reason, f.nack.unprocessed)
    return got


def test_consume_acks_and_nacks_by_the_handlers_outcome(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon, batch=False)

    def behavior(m):
        v = m.value
        if v == b"fail":
            raise ValueError("bad document")
        if v == b"retry":
            raise fanout_client.RetryAfter(2.5, "search index: 503")
        if v == b"retry-from":
            try:
                raise OSError("db down")
            except OSError as e:
                raise fanout_client.RetryAfter(1) from e
        if v == b"self":
            m.nack(delay=1.0, reason="mine")

    t, out = flavor.consume_bg(c, behavior, 2)
    try:
        for i, v in enumerate([b"ok", b"fail", b"retry", b"retry-from", b"self"], 1):
            conn.deliver(i, v, offset=i)
        got = settled(conn, 5)
        assert got[1] == ("ack",)
        assert got[2] == ("nack", 0, "ValueError: bad document", False)  # no delay: the daemon's --retry-backoff
        assert got[3] == ("nack", 2500, "search index: 503", False)
        assert got[4] == ("nack", 1000, "OSError: db down", False)
        assert got[5] == ("nack", 1000, "mine", False)  # settled by the handler: nothing more
        assert t.is_alive()
    finally:
        c.close()
    t.join(TIMEOUT)
    assert not t.is_alive()
    assert out == {}  # consume returned: closed


def test_consume_runs_at_most_concurrency_handlers(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon)
    gate = threading.Event()
    lock = threading.Lock()
    running, most = [0], [0]

    def behavior(m):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        gate.wait(TIMEOUT)
        with lock:
            running[0] -= 1

    t, out = flavor.consume_bg(c, behavior, 3)
    try:
        for i in range(1, 7):
            conn.deliver(i, offset=i)
        deadline = time.monotonic() + TIMEOUT
        while running[0] < 3:
            assert time.monotonic() < deadline, f"{running[0]} handlers running, want 3"
            time.sleep(0.01)
        time.sleep(0.3)
        assert (running[0], most[0]) == (3, 3)
        gate.set()
        assert sorted(settled(conn, 6)) == [1, 2, 3, 4, 5, 6]
        assert most[0] == 3
    finally:
        gate.set()
        c.close()
    t.join(TIMEOUT)
    assert out == {}


def test_consume_stops_gracefully_on_close_with_drain(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon)
    gate = threading.Event()
    started = threading.Semaphore(0)

    def behavior(m):
        started.release()
        gate.wait(TIMEOUT)

    t, out = flavor.consume_bg(c, behavior, 2)
    conn.deliver(1, offset=1)
    conn.deliver(2, offset=2)
    assert started.acquire(timeout=TIMEOUT) and started.acquire(timeout=TIMEOUT)
    closer = threading.Thread(target=c.close, kwargs={"drain": TIMEOUT})
    closer.start()
    conn.deliver(3, offset=3)  # after the drain began: not handed out, given back
    nack = conn.expect("nack").nack
    assert list(nack.delivery_ids) == [3] and nack.unprocessed
    assert conn.at_eof(0.3) is False  # the running handlers hold the session open
    assert t.is_alive()
    gate.set()
    assert sorted(settled(conn, 2)) == [1, 2]
    assert conn.expect("goodbye").goodbye.reason == "client closing"
    conn.close()
    closer.join(TIMEOUT)
    t.join(TIMEOUT)
    assert not t.is_alive() and not closer.is_alive()
    assert out == {}


def test_consume_raises_the_error_of_a_client_that_gave_up(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon, max_frame_size=4096)
    t, out = flavor.consume_bg(c, lambda m: None, 2)
    conn.send_raw(frame_len(4097))
    t.join(TIMEOUT)
    assert isinstance(out.get("error"), fanout_client.FrameTooLargeError)
    c.close()


def test_consume_refuses_no_workers(flavor, daemon):
    c, conn, _ = open_session(flavor, daemon)
    try:
        t, out = flavor.consume_bg(c, lambda m: None, 0)
        t.join(TIMEOUT)
        assert isinstance(out.get("error"), ValueError)
    finally:
        c.close()


def test_retry_after_reads_as_its_reason():
    assert str(fanout_client.RetryAfter(3, "busy")) == "busy"
    assert str(fanout_client.RetryAfter(3)) == "retry after 3s"
    with pytest.raises(ValueError):
        fanout_client.RetryAfter(-1)


# ---------------------------------------------------------------- asyncio only


def test_aio_cancelled_consume_nacks_the_messages_in_hand(daemon):
    async def main():
        c = aio.Client(daemon.addr, **FAST)
        accept = asyncio.get_running_loop().run_in_executor(None, daemon.accept)
        connecting = asyncio.ensure_future(c.connect(TIMEOUT))
        conn = await accept
        await asyncio.get_running_loop().run_in_executor(None, conn.welcome)
        await connecting
        forever = asyncio.Event()
        started = asyncio.Event()

        async def handler(m):
            started.set()
            await forever.wait()

        consuming = asyncio.ensure_future(c.consume(handler, concurrency=1))
        conn.deliver(7)
        await asyncio.wait_for(started.wait(), TIMEOUT)
        consuming.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consuming
        nack = (await asyncio.get_running_loop().run_in_executor(None, conn.expect, "nack")).nack
        assert list(nack.delivery_ids) == [7] and nack.reason == "handler cancelled" and not nack.unprocessed
        await c.close()

    asyncio.run(main())


def test_aio_acks_of_one_turn_go_in_one_frame_as_a_range(daemon):
    async def main():
        loop = asyncio.get_running_loop()
        c = aio.Client(daemon.addr, **FAST)
        accept = loop.run_in_executor(None, daemon.accept)
        connecting = asyncio.ensure_future(c.connect(TIMEOUT))
        conn = await accept
        await loop.run_in_executor(None, lambda: conn.welcome(capabilities=[pb.CAPABILITY_BATCH]))
        await connecting
        for i in range(100, 110):
            conn.deliver(i, offset=i)
        msgs = [await c.get(TIMEOUT) for _ in range(10)]
        for m in msgs:
            await m.ack()  # queued: nothing is written before this task yields
        f = await loop.run_in_executor(None, conn.expect, "ack")
        assert list(f.ack.delivery_ids) == [] and list(f.ack.ranges) == [100, 10]
        await c.close()

    asyncio.run(main())


def test_no_ack_waits_for_the_next_frame(flavor, daemon):
    """Acks from many threads at once: each is sent without waiting for
    something else to wake the connection. The daemon delivers a message only
    when one is acked, keeping four in flight: an ack the connection did not
    wake up for stalls it (until the test's timeout)."""
    c, conn, _ = open_session(flavor, daemon, welcome=dict(max_in_flight=4))
    t, out = flavor.consume_bg(c, lambda m: None, 8)
    try:
        n, sent, acked = 5000, 0, set()
        for _ in range(4):
            sent += 1
            conn.deliver(sent, offset=sent)
        while len(acked) < n:
            f = conn.expect("ack")
            ids = list(f.ack.delivery_ids) + [f.ack.ranges[i] + k for i in range(0, len(f.ack.ranges), 2)
                                              for k in range(f.ack.ranges[i + 1])]
            for i in ids:
                assert i not in acked
                acked.add(i)
                if sent < n:
                    sent += 1
                    conn.deliver(sent, offset=sent)
    finally:
        c.close()
    t.join(TIMEOUT)
    assert out == {}


def test_an_interrupted_consume_closes_the_client_and_raises(daemon):
    """Ctrl-C in the thread running consume: the client is closed at once
    (the message in hand comes again: its ack is refused), the workers stop,
    and consume raises KeyboardInterrupt."""
    import signal

    from flavors import THREADS

    c, conn, _ = open_session(THREADS, daemon)
    started, gate, acks = threading.Event(), threading.Event(), []

    def handler(m):
        started.set()
        gate.wait(TIMEOUT)
        try:
            m.ack()
        except fanout_client.SessionClosedError as e:
            acks.append(e)

    def interrupt():
        assert started.wait(TIMEOUT)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # the thread running consume
        assert conn.expect("goodbye").goodbye.reason == "client closing"
        gate.set()

    conn.deliver(1)
    helper = threading.Thread(target=interrupt, daemon=True)
    helper.start()
    with pytest.raises(KeyboardInterrupt):
        c.consume(handler, concurrency=2)
    helper.join(TIMEOUT)
    assert len(acks) == 1  # the worker finished before consume raised


def test_a_handlers_exception_is_logged_with_its_traceback(flavor, daemon, caplog):
    c, conn, _ = open_session(flavor, daemon)

    def behavior(m):
        raise KeyError("doc-7")

    t, out = flavor.consume_bg(c, behavior, 1)
    try:
        conn.deliver(1)
        assert conn.expect("nack").nack.reason == "KeyError: 'doc-7'"
    finally:
        c.close()
    t.join(TIMEOUT)
    (rec,) = [r for r in caplog.records if r.getMessage().startswith("handler failed")]
    assert rec.levelname == "WARNING" and rec.exc_info and rec.exc_info[0] is KeyError
