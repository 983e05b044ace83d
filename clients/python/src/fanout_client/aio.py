"""The asyncio client of fanout::

    from fanout_client import aio

    async with await aio.connect(["fanout1:4987"], max_in_flight=64) as client:
        async for msg in client:
            await process(msg.value)
            await msg.ack()

It behaves as :class:`fanout_client.Client` (the same handshake, batches,
redirects, reconnect with backoff, TLS, member list, on the same protocol
code) without a thread: each connection is an ``asyncio.Protocol`` fed by the
event loop, each link a task. Everything is called from the event loop's
thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from typing import Any, Awaitable, Callable, ContextManager, List, Optional, Sequence, Tuple, Union

from . import _state, _wire
from ._core import ClientBase, Connect, LinkBase, Serve, Step, Wait, log_of
from ._options import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_BACKOFF,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MIN_BACKOFF,
    Options,
    split_addr,
)
from ._pool import RetryAfter, check_concurrency, settle
from ._proto import fanout_pb2 as pb
from ._state import SessionState, StaleError
from .errors import ClosedError, ConnectError, ConnectionLostError, DaemonSilentError, FanoutError
from .message import OP_ACK, OP_NACK, BaseMessage

__all__ = ["Client", "Message", "RetryAfter", "connect"]


class Message(BaseMessage):
    """One delivery of a Kafka record, from :class:`Client`: the record's and
    the delivery's attributes are :class:`fanout_client.BaseMessage`'s.

    ``await msg.ack()`` queues the ack and returns: the connection sends every
    id queued in the same turn of the event loop in one frame. Delivery is at
    least once: process idempotently.
    """

    __slots__ = ()

    async def ack(self) -> bool:
        """Tells the daemon the message is processed. Returns True once the
        ack is queued for sending.

        Raises:
            SessionClosedError: the message's session has ended (its
                connection broke, it retired, or the client was closed):
                nothing is sent, and the daemon delivers the message again.
            AlreadyAckedError: after a previous ack() or nack().
        """
        return self._finish(OP_ACK)

    async def nack(self, delay: Optional[float] = None, reason: str = "") -> bool:
        """Gives the message back for redelivery after delay seconds (at most
        15 minutes; None or 0: the daemon's --retry-backoff), reason going to
        the daemon's logs and the dead-letter record. Returns and raises like
        ack()."""
        return self._finish(OP_NACK, delay, reason)

    async def touch(self) -> bool:
        """Restarts the message's ack timeout on the daemon, for work that
        takes longer than it. Returns and raises like ack()."""
        return self._touch()


class Client(ClientBase[Message, "Session", "_Link"]):
    """Receives messages from a fanout cluster in an asyncio program. The
    arguments are :class:`fanout_client.Client`'s; ``await client.connect()``
    (or :func:`connect`) starts it in the running event loop.

    Use it as an async context manager and iterate over it::

        async with await fanout_client.aio.connect("localhost:4987") as client:
            async for msg in client:
                await msg.ack()
    """

    def __init__(
        self,
        addrs: Union[str, Sequence[str]],
        *,
        client_id: Optional[str] = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        auth_token: str = "",
        ssl_context: Optional[ssl.SSLContext] = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        reconnect: bool = True,
        min_backoff: float = DEFAULT_MIN_BACKOFF,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
        max_frame_size: int = _wire.DEFAULT_MAX_FRAME_SIZE,
        batch: bool = True,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        super().__init__(Options(
            addrs, client_id=client_id, max_in_flight=max_in_flight, auth_token=auth_token, ssl_context=ssl_context,
            connect_timeout=connect_timeout, reconnect=reconnect, min_backoff=min_backoff, max_backoff=max_backoff,
            max_frame_size=max_frame_size, batch=batch, logger=logger,
        ))
        # Bound to the event loop by connect (an asyncio.Event made outside it
        # would belong to another loop on Python 3.9).
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._changed: Optional[asyncio.Event] = None  # set on every change: a message, welcomed, closing

    def _locked(self) -> ContextManager[Any]:
        return contextlib.nullcontext()  # only the event loop's thread touches the state

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def _new_link(self, member: str, credit: int) -> "_Link":
        return _Link(self, member, credit)

    async def _wait_change(self, end: Optional[float]) -> bool:
        """Waits for a change until end (the loop's time; None: no end);
        False when end came first."""
        loop, changed = self._loop, self._changed
        assert loop is not None and changed is not None
        changed.clear()
        if end is None:
            await changed.wait()
            return True
        left = end - loop.time()
        if left <= 0:
            return False
        try:
            await asyncio.wait_for(changed.wait(), left)
        except asyncio.TimeoutError:
            return False
        return True

    # ------------------------------------------------------------ public API

    async def connect(self, timeout: Optional[float] = 30.0) -> "Client":
        """Starts the client in the running event loop and returns it once a
        daemon has welcomed it, retrying failures until timeout (None:
        forever).

        Raises:
            ConnectError: as :meth:`fanout_client.Client.connect`.
        """
        if self._closing.is_set():
            raise ClosedError("fanout client: connect after close")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._changed = asyncio.Event()
            self._start_link("", self.max_in_flight)
        end = None if timeout is None else self._loop.time() + timeout
        while not self._welcomed and self._error is None:
            if not await self._wait_change(end):
                break
        if self._welcomed:
            return self
        err = self._error or self._last_error
        await self.close()
        raise ConnectError(f"fanout client: no daemon of {self.addrs} welcomed the client: {err}") from err

    async def get(self, timeout: Optional[float] = None) -> Optional[Message]:
        """Returns the next message, waiting at most timeout seconds (None:
        until one comes); None when none came in time.

        Raises:
            ClosedError: the client was closed (or never connected).
            FanoutError: the client gave up (see :attr:`error`).
        """
        if self._loop is None:
            raise ClosedError("fanout client: get before connect")
        end = None if timeout is None else self._loop.time() + timeout
        while True:
            while not self._queue:
                if self._error is not None:
                    raise self._error
                if self._closing.is_set():
                    raise ClosedError("fanout client closed")
                if not await self._wait_change(end):
                    return None
            m = self._queue.popleft()
            s = m._session
            assert isinstance(s, Session)
            if s.usable():
                return m
            s.release(m)  # its session ended or retires: the daemon delivers it again

    def __aiter__(self) -> "Client":
        return self

    async def __anext__(self) -> Message:
        """The next message; the iteration ends when the client is closed,
        and raises the client's error if it gives up."""
        while True:
            try:
                m = await self.get()
            except ClosedError:
                if self._error is not None:
                    raise self._error from None
                raise StopAsyncIteration from None
            if m is not None:
                return m

    async def consume(self, handler: Callable[[Message], Awaitable[Any]], concurrency: int = 1) -> None:
        """Runs the coroutine function handler on the client's messages in
        concurrency tasks (the workers), and acks or nacks each message by
        its outcome, as :meth:`fanout_client.Client.consume` does (an
        exception nacks, :class:`RetryAfter` with its delay).

        It returns once every worker has stopped, after the client is closed;
        it raises the client's error if the client gives up. For a graceful
        stop, ``await client.close(drain=seconds)`` from another task (a
        signal handler's, ``loop.add_signal_handler``): no new messages are
        handed out, the running handlers finish, their acks are sent, then
        goodbye. Cancelling consume cancels the workers: a handler cancelled
        in its work nacks its message.
        """
        check_concurrency(concurrency)
        if self._loop is None:
            raise ClosedError("fanout client: consume before connect")
        loop = asyncio.get_running_loop()
        workers = [loop.create_task(self._work(handler)) for _ in range(concurrency)]
        await asyncio.gather(*workers)
        if self._error is not None:
            raise self._error

    async def _work(self, handler: Callable[[Message], Awaitable[Any]]) -> None:
        while True:
            try:
                m = await self.get()
            except FanoutError:
                return  # closed, or given up: consume raises the error
            if m is None:
                continue
            try:
                await handler(m)
            except asyncio.CancelledError:
                settle(m, RetryAfter(0, "handler cancelled"), self.log)
                raise
            except Exception as e:  # noqa: BLE001 - a handler's failure nacks its message
                settle(m, e, self.log)
                continue
            settle(m, None, self.log)

    async def close(self, drain: float = 0.0) -> None:
        """Closes every session: sends the acks queued so far and a Goodbye,
        waits for the daemons to close the connections (a couple of seconds
        at most) and stops reconnecting. Messages not acked by then come
        again, to other clients; their ack() raises SessionClosedError.

        Args:
            drain: seconds to wait first, after passing no more messages on,
                for the messages already handed out to be acked or nacked.

        Safe to call more than once.
        """
        links = self._close_links(drain)
        me = asyncio.current_task()
        await asyncio.gather(*(link.task for link in links if link.task is not me), return_exceptions=True)

    async def __aenter__(self) -> "Client":
        if self._loop is None:
            await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ connecting

    async def _connect(self, link: "_Link", addr: str, credit: int) -> "Session":
        """Connects to addr for link, following up to MAX_REDIRECTS redirects."""
        for _ in range(_state.MAX_REDIRECTS + 1):
            s, redirect = await self._handshake(link, addr, credit)
            if s is not None:
                return s
            self.log.info("redirected from %s to the leader at %s", addr, redirect)
            addr = redirect
        raise _state.too_many_redirects(addr)

    async def _handshake(self, link: "_Link", addr: str, credit: int) -> Tuple[Optional["Session"], str]:
        """Dials addr, sends Hello and reads the answer: a session for a
        Welcome, the leader's address for a Redirect, or an error."""
        opts = self.opts
        loop = asyncio.get_running_loop()
        host, port = split_addr(addr)
        conn = _Conn(addr, _state.hello(opts, credit), opts.max_frame_size, loop)
        end = loop.time() + opts.connect_timeout
        ctx = opts.ssl_context
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: conn, host, port, ssl=ctx, server_hostname=host if ctx else None),
                opts.connect_timeout,
            )
        except asyncio.TimeoutError:
            raise ConnectionError(f"dial {addr}: no connection in {opts.connect_timeout}s") from None
        except ssl.SSLError as e:
            raise ConnectionError(f"TLS handshake with {addr}: {e}") from e
        except OSError as e:
            raise ConnectionError(f"dial {addr}: {e}") from e
        ok = False
        try:
            try:
                a = await asyncio.wait_for(conn.answer, max(0.0, end - loop.time()))
            except asyncio.TimeoutError:
                raise ConnectionError(f"handshake with {addr}: no answer in {opts.connect_timeout}s") from None
            if isinstance(a, str):
                return None, a
            ok = True
            return Session(self, link, conn, addr, a, credit), ""
        finally:
            if not ok:
                conn.abandon()


class _Conn(asyncio.Protocol):
    """A connection's asyncio protocol: it sends the Hello, reads the frames
    up to the daemon's answer, then hands every event to its session."""

    def __init__(self, addr: str, hello: bytes, max_frame_size: int, loop: asyncio.AbstractEventLoop) -> None:
        self.addr = addr
        self.hello = hello
        self.reader = _wire.FrameReader(max_frame_size)
        self.transport: Optional[asyncio.Transport] = None
        #: The Welcome, or the leader's address of a Redirect.
        self.answer: "asyncio.Future[Union[pb.Welcome, str]]" = loop.create_future()
        #: Frames after the answer, before a session took over.
        self.after: List[pb.Frame] = []
        #: Why the connection failed after the answer, before a session took over.
        self.error: Optional[BaseException] = None
        self.lost = False  # connection_lost was called
        self.session: Optional[Session] = None

    def abandon(self) -> None:
        """Drops the connection (no session took it)."""
        if not self.answer.done():
            self.answer.cancel()
        if self.transport is not None and not self.lost:
            self.transport.abort()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.hello)

    def data_received(self, data: bytes) -> None:
        if self.session is not None:
            self.session.data_received(data)
            return
        try:
            for f in self.reader.feed(data):
                if self.answer.done():
                    self.after.append(f)
                    continue
                a = _state.answer(f, self.addr)
                if a is not None:
                    self.answer.set_result(a)
        except Exception as e:  # noqa: BLE001 - every failure ends the handshake
            self._failed(e)

    def eof_received(self) -> Optional[bool]:
        return None  # the transport closes; connection_lost follows

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.lost = True
        if self.session is not None:
            self.session.connection_lost(exc)
            return
        why = f": {exc}" if exc else ""
        self._failed(ConnectionError(f"handshake with {self.addr}: connection closed{why}"))

    def pause_writing(self) -> None:
        if self.session is not None:
            self.session.pause_writing()

    def resume_writing(self) -> None:
        if self.session is not None:
            self.session.resume_writing()

    def _failed(self, err: BaseException) -> None:
        if not self.answer.done():
            self.answer.set_exception(err)
        elif self.error is None:
            self.error = err
        if self.transport is not None and not self.lost:
            self.transport.abort()


class Session:
    """One welcomed connection, served by the event loop: its protocol's
    callbacks feed the frames to the shared protocol state
    (``_state.SessionState``), acks queued in one turn of the loop go out in
    one write, timers (liveness, the drain's deadline, a write the daemon
    does not read, the linger after Goodbye) are the loop's. ``run`` awaits
    its end."""

    def __init__(self, client: Client, link: "_Link", conn: _Conn, addr: str, welcome: pb.Welcome, credit: int) -> None:
        self.client = client
        self.link = link
        self.addr = addr
        self.credit = credit
        self.state = SessionState(client.opts, addr, welcome, credit)
        self.log = log_of(client.log, self.state)
        self._conn = conn
        assert conn.transport is not None
        self._transport: asyncio.Transport = conn.transport
        self._loop = asyncio.get_running_loop()
        #: Why the session ended, once it has.
        self.done: "asyncio.Future[BaseException]" = self._loop.create_future()
        self._flush_soon = False
        self._closing = False  # Goodbye sent: wait for the daemon to close
        self._last_read = time.monotonic()
        self._live: Optional[asyncio.TimerHandle] = None
        self._drain_timer: Optional[asyncio.TimerHandle] = None
        self._write_timer: Optional[asyncio.TimerHandle] = None
        self._linger: Optional[asyncio.TimerHandle] = None

    # ------------------------------------------------------------ the application's side

    def finish(self, msg: BaseMessage, op: int, delay_ms: int, reason: str) -> None:
        """Queues msg's ack (op OP_ACK) or nack; see Message.ack."""
        self.state.finish(msg, op, delay_ms, reason)
        self.signal()

    def touch(self, msg: BaseMessage) -> None:
        self.state.touch(msg)
        self.signal()

    def release(self, msg: BaseMessage) -> None:
        self.state.release(msg)
        self.signal()

    def usable(self) -> bool:
        return self.state.usable()

    def retire(self, drain_timeout: Optional[float] = None) -> None:
        """As the threaded client's Session.retire."""
        if self.state.retire(time.monotonic(), drain_timeout) and self.state.drain_deadline is not None:
            self._drain_timer = self._loop.call_later(
                max(0.0, self.state.drain_deadline - time.monotonic()), self.signal
            )
        self.client._drop_queued(self)
        self.signal()

    def retired(self) -> bool:
        return self.state.draining

    def signal(self) -> None:
        """Has what is queued sent in this turn of the loop (once)."""
        if not self._flush_soon and not self.done.done():
            self._flush_soon = True
            self._loop.call_soon(self._flush)

    # ------------------------------------------------------------ the link's side

    async def run(self) -> BaseException:
        """Serves the session until it ends; returns why."""
        conn = self._conn
        conn.session = self
        pending, conn.after = conn.after, []
        try:
            for f in pending:
                self._handle(f)
            if conn.error is not None:
                raise conn.error
            if conn.lost:
                raise ConnectionLostError(f"connection closed by {self.addr}")
        except Exception as e:  # noqa: BLE001 - every failure ends the session
            self._fail(e)
        if self.state.liveness is not None and not self.done.done():
            self._live = self._loop.call_later(self.state.liveness, self._check_live)
        self._flush()
        err: BaseException = ClosedError("session cancelled")
        try:
            err = await self.done
        finally:
            self.state.end(err)
            for t in (self._live, self._drain_timer, self._write_timer, self._linger):
                if t is not None:
                    t.cancel()
            if not conn.lost:
                self._transport.abort()
            self.client._drop_queued(self)
        return err

    # ------------------------------------------------------------ the connection's side

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        self._last_read = time.monotonic()
        try:
            for f in self._conn.reader.feed(data):
                if not self._closing:
                    self._handle(f)
        except Exception as e:  # noqa: BLE001 - every failure ends the session
            self._fail(e)
            return
        self.signal()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self._closing:
            self._end(ClosedError("client closed"))
        elif exc is not None:
            self._end(ConnectionLostError(f"read from {self.addr}: {exc}"))
        else:
            self._end(ConnectionLostError(f"connection closed by {self.addr}"))

    def pause_writing(self) -> None:
        if self._write_timer is None:
            self._write_timer = self._loop.call_later(self.state.write_timeout, self._write_stuck)

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_stuck(self) -> None:
        self._fail(ConnectionLostError(f"write to {self.addr}: not read for {self.state.write_timeout:.1f}s"))

    def _check_live(self) -> None:
        liveness = self.state.liveness
        if self.done.done() or self._closing or liveness is None:
            return
        left = self._last_read + liveness - time.monotonic()
        if left > 0:
            self._live = self._loop.call_later(left, self._check_live)
            return
        self._fail(DaemonSilentError(f"daemon {self.addr} silent for more than {liveness:.1f}s"))

    def _handle(self, f: pb.Frame) -> None:
        deliveries, members = self.state.handle(f, self.log)
        for d in deliveries:
            self.client._put(Message._of(d, self))
        if members is not None:
            self.client._follow_members(self.link, members[0], members[1])

    def _flush(self) -> None:
        self._flush_soon = False
        if self.done.done() or self._closing:
            return
        c = self.client
        closing = c._closing.is_set()
        if closing:
            if c._drain > 0 and not self.state.draining:
                self.retire(c._drain)
            elif c._drain <= 0:
                self._goodbye(ClosedError("client closed"), "client closing")
                return
        if self.state.goodbye_due(time.monotonic()):
            if self.state.held > 0:
                self.log.warning("retired session with %s: %d messages not acked in time; they come again",
                                 self.addr, self.state.held)
            if closing:
                self._goodbye(ClosedError("client closed"), "client closing")
            else:
                self._goodbye(StaleError("session retired"), "session retired")
            return
        data = self.state.take()
        if data:
            self._transport.write(data)

    def _goodbye(self, ended: BaseException, reason: str) -> None:
        """Stops the queueing of ids, sends what was queued and a Goodbye, and
        waits for the daemon to close (at most LINGER_TIMEOUT)."""
        self._transport.write(self.state.goodbye(ended, reason))
        self._closing = True
        if self._transport.can_write_eof():
            self._transport.write_eof()
        self._linger = self._loop.call_later(_state.LINGER_TIMEOUT, self._fail, ClosedError("client closed"))

    def _fail(self, err: BaseException) -> None:
        self._end(err)
        if not self._conn.lost:
            self._transport.abort()

    def _end(self, err: BaseException) -> None:
        if not self.done.done():
            self.done.set_result(err)


class _Link(LinkBase[Session]):
    """A link (see _core.LinkBase) whose steps its task carries out."""

    def __init__(self, client: Client, member: str, credit: int) -> None:
        super().__init__(client, member, credit)
        self._client = client
        self._wait = asyncio.Event()  # set to interrupt a backoff
        self._attempt: "Optional[asyncio.Future[Session]]" = None
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"fanout-link-{member or 'cluster'}")

    def _interrupt(self) -> None:
        self._wait.set()
        if self._attempt is not None:
            self._attempt.cancel()

    async def _run(self) -> None:
        try:
            steps = self.steps()
            result: Any = None
            failure: Optional[Exception] = None
            while True:
                try:
                    step = steps.send(result) if failure is None else steps.throw(failure)
                except StopIteration:
                    return
                result, failure = None, None
                try:
                    result = await self._do(step)
                except Exception as e:  # noqa: BLE001 - a failed attempt goes back into the steps
                    failure = e
        finally:
            self.client._link_exited(self)

    async def _do(self, step: Step) -> Any:
        if isinstance(step, Wait):
            try:
                await asyncio.wait_for(self._wait.wait(), step.seconds)
            except asyncio.TimeoutError:
                pass
            return None
        if isinstance(step, Connect):
            self._attempt = asyncio.ensure_future(self._client._connect(self, step.addr, step.credit))
            try:
                return await self._attempt
            except asyncio.CancelledError:
                if not self._over():
                    raise
                raise ConnectionError(f"connection attempt to {step.addr} interrupted") from None
            finally:
                self._attempt = None
        assert isinstance(step, Serve)
        return await step.session.run()


async def connect(
    addrs: Union[str, Sequence[str]],
    timeout: Optional[float] = 30.0,
    *,
    client_id: Optional[str] = None,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    auth_token: str = "",
    ssl_context: Optional[ssl.SSLContext] = None,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    reconnect: bool = True,
    min_backoff: float = DEFAULT_MIN_BACKOFF,
    max_backoff: float = DEFAULT_MAX_BACKOFF,
    max_frame_size: int = _wire.DEFAULT_MAX_FRAME_SIZE,
    batch: bool = True,
    logger: Optional[logging.Logger] = None,
) -> Client:
    """Returns a connected Client, started in the running event loop (the
    arguments are :class:`fanout_client.Client`'s; timeout and the errors
    :meth:`fanout_client.Client.connect`'s)::

        async with await fanout_client.aio.connect("localhost:4987") as client:
            ...
    """
    return await Client(
        addrs, client_id=client_id, max_in_flight=max_in_flight, auth_token=auth_token, ssl_context=ssl_context,
        connect_timeout=connect_timeout, reconnect=reconnect, min_backoff=min_backoff, max_backoff=max_backoff,
        max_frame_size=max_frame_size, batch=batch, logger=logger,
    ).connect(timeout)
