"""The fanout client: sessions with the daemons of one cluster, their
messages merged into one iterator."""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from typing import Any, Callable, ContextManager, Iterator, List, Optional, Sequence, Tuple, Union

from . import _state, _wire
from ._core import ClientBase, Connect, LinkBase, Serve, Step, Wait
from ._options import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_BACKOFF,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MIN_BACKOFF,
    Options,
    split_addr,
)
from ._pool import check_concurrency, settle
from ._proto import fanout_pb2 as pb
from ._session import Session
from .errors import ClosedError, ConnectError, FanoutError
from .message import Message

__all__ = ["Client", "connect"]


class Client(ClientBase[Message, Session, "_Link"]):
    """Receives messages from a fanout cluster: over one connection, to the
    leader, in leader mode; over one connection per member in spread mode.
    It follows redirects, answers the daemon's pings, detects a silent daemon
    and reconnects with backoff by itself.

    Use it as a context manager and iterate over it::

        with fanout_client.Client(["localhost:4987"]) as client:
            for msg in client:
                process(msg.value)
                msg.ack()

    Args:
        addrs: host:port addresses (or one string) of daemons of one cluster,
            tried in order, then round-robin; a follower redirects to the
            leader. In spread mode one address is enough: the daemon lists
            the members and the client keeps a session with each.
        client_id: names the client in the daemon's logs; default host-pid.
        max_in_flight: how many delivered, unacked messages the client holds
            at once. In spread mode it is split over the members: each
            session asks for max_in_flight // members, at least 1.
        auth_token: sent in Hello when the daemon requires one.
        ssl_context: connect with TLS (``ssl.create_default_context(cafile=...)``);
            the host of each address is the server name checked.
        connect_timeout: bounds each connection attempt, handshake included.
        reconnect: False makes the client try each address once and stop
            when a connection ends other than by its own choice. By default
            it reconnects until closed, waiting min_backoff..max_backoff
            (exponential, with jitter) between failed attempts.
        max_frame_size: the largest frame the client reads, announced in
            Hello (the daemon sends no larger one); default 4 MiB.
        batch: announce CAPABILITY_BATCH: the daemon may deliver many
            messages per frame and, once its Welcome confirms it, acks name
            ranges of ids. Either way messages come one by one.
        logger: receives connection events; default ``logging.getLogger("fanout_client")``.

    Delivery is at least once: a message not acked within the daemon's ack
    timeout, or whose connection breaks before its ack is sent, comes again,
    possibly to another client. Process messages idempotently.
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
        self._cond = threading.Condition()  # guards the state of ClientBase
        self._started = False

    def _locked(self) -> ContextManager[Any]:
        return self._cond

    def _notify(self) -> None:
        self._cond.notify_all()

    def _arrived(self) -> None:
        self._cond.notify()

    def _new_link(self, member: str, credit: int) -> "_Link":
        link = _Link(self, member, credit)
        link.thread.start()
        return link

    # ------------------------------------------------------------ public API

    def connect(self, timeout: Optional[float] = 30.0) -> "Client":
        """Starts the client and returns it once a daemon has welcomed it,
        retrying failures until timeout (None: forever).

        Raises:
            ConnectError: no daemon welcomed the client in time, or one
                answered with an error that retrying cannot change (a wrong
                auth token, an unsupported version): its ``__cause__``.
        """
        with self._cond:
            if self._closing.is_set():
                raise ClosedError("fanout client: connect after close")
            if not self._started:
                self._started = True
                self._start_link("", self.max_in_flight)
            end = None if timeout is None else time.monotonic() + timeout
            while not self._welcomed and self._error is None:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            if self._welcomed:
                return self
            err = self._error or self._last_error
        self.close()
        raise ConnectError(f"fanout client: no daemon of {self.addrs} welcomed the client: {err}") from err

    def get(self, timeout: Optional[float] = None) -> Optional[Message]:
        """Returns the next message, waiting at most timeout seconds (None:
        until one comes); None when none came in time.

        Raises:
            ClosedError: the client was closed.
            FanoutError: the client gave up (see :attr:`error`).
        """
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                while not self._queue:
                    if self._error is not None:
                        raise self._error
                    if self._closing.is_set():
                        raise ClosedError("fanout client closed")
                    left = None if end is None else end - time.monotonic()
                    if left is not None and left <= 0:
                        return None
                    self._cond.wait(left)
                m = self._queue.popleft()
            s = m._session
            assert isinstance(s, Session)
            if s.usable():
                return m
            s.release(m)  # its session ended or retires: the daemon delivers it again

    def __iter__(self) -> Iterator[Message]:
        """Yields messages until the client is closed; raises the client's
        error if it gives up (a permanent error from the daemon)."""
        while True:
            try:
                m = self.get()
            except ClosedError:
                if self._error is not None:
                    raise self._error from None
                return
            if m is not None:
                yield m

    def consume(self, handler: Callable[[Message], object], concurrency: int = 1) -> None:
        """Runs handler on the client's messages in concurrency threads (the
        workers), and acks or nacks each message by its outcome: a handler
        that returns acks its message (unless it acked or nacked it itself);
        one that raises nacks it, the exception's text the nack's reason,
        without a delay (the daemon's --retry-backoff applies) unless it
        raised :class:`RetryAfter` with one. An ack or nack that cannot be
        sent (the message's session ended) is logged: the message comes
        again.

        consume returns once every worker has stopped, after the client is
        closed; it raises the client's error if the client gives up. For a
        graceful stop call ``close(drain=seconds)`` from another thread (a
        signal handler's, say): no new messages are handed out, the running
        handlers finish, their acks are sent, then goodbye. An exception in
        the calling thread (KeyboardInterrupt) closes the client at once (the
        messages in hand come again) and is raised once the workers stopped.

        The workers are the only threads started: concurrency bounds the
        handlers running at once. More workers than max_in_flight have
        nothing to do.
        """
        check_concurrency(concurrency)
        # Counted by the workers themselves, and waited for on a condition rather than with Thread.join: a
        # KeyboardInterrupt in Thread.start or Thread.join can leave a thread's state wrong (a running
        # thread taken for stopped), and a worker started after the client closed stops at once anyway.
        pool = _Pool(self, handler)
        try:
            for i in range(concurrency):
                threading.Thread(target=pool.work, name=f"fanout-worker-{i}", daemon=True).start()
            pool.wait(concurrency)
        except BaseException:
            self.close()
            pool.wait(0)
            raise
        if self._error is not None:
            raise self._error

    def close(self, drain: float = 0.0) -> None:
        """Closes every session: sends the acks queued so far and a Goodbye,
        waits for the daemons to close the connections (a couple of seconds
        at most) and stops reconnecting. Messages not acked by then come
        again, to other clients; their ack() raises SessionClosedError.

        Args:
            drain: seconds to wait first, after passing no more messages on,
                for the messages already handed out to be acked or nacked
                (then the daemon need not deliver them again).

        Safe to call more than once, and from any thread.
        """
        for link in self._close_links(drain):
            if link.thread is not threading.current_thread():
                link.thread.join()

    def __enter__(self) -> "Client":
        if not self._started:
            self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ connecting

    def _connect(self, link: "_Link", addr: str, credit: int) -> Session:
        """Connects to addr for link, following up to MAX_REDIRECTS redirects."""
        for _ in range(_state.MAX_REDIRECTS + 1):
            s, redirect = self._handshake(link, addr, credit)
            if s is not None:
                return s
            self.log.info("redirected from %s to the leader at %s", addr, redirect)
            addr = redirect
        raise _state.too_many_redirects(addr)

    def _handshake(self, link: "_Link", addr: str, credit: int) -> Tuple[Optional[Session], str]:
        """Dials addr, sends Hello and reads the answer: a session for a
        Welcome, the leader's address for a Redirect, or an error."""
        opts = self.opts
        host, port = split_addr(addr)
        deadline = time.monotonic() + opts.connect_timeout
        try:
            raw = socket.create_connection((host, port), timeout=opts.connect_timeout)
        except OSError as e:
            raise ConnectionError(f"dial {addr}: {e}") from e
        sock: socket.socket = raw
        ok = False
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if opts.ssl_context is not None:
                try:
                    sock = opts.ssl_context.wrap_socket(raw, server_hostname=host)
                except (OSError, ssl.SSLError) as e:
                    raise ConnectionError(f"TLS handshake with {addr}: {e}") from e
            try:
                sock.sendall(_state.hello(opts, credit))
            except OSError as e:
                raise ConnectionError(f"hello to {addr}: {e}") from e
            reader = _wire.FrameReader(opts.max_frame_size)
            frames: List[pb.Frame] = []
            while True:
                while not frames:
                    left = deadline - time.monotonic()
                    if left <= 0 or link.stopping or self._closing.is_set():
                        raise ConnectionError(f"handshake with {addr}: no answer in {opts.connect_timeout}s")
                    sock.settimeout(min(left, 0.25))
                    try:
                        data = sock.recv(256 * 1024)
                    except socket.timeout:
                        continue
                    except OSError as e:
                        raise ConnectionError(f"handshake with {addr}: {e}") from e
                    if not data:
                        raise ConnectionError(f"handshake with {addr}: connection closed")
                    frames = reader.feed(data)
                a = _state.answer(frames.pop(0), addr)
                if a is None:
                    continue
                if isinstance(a, str):
                    return None, a
                s = Session(self, link, sock, addr, reader, a, credit, frames)
                ok = True
                return s, ""
        finally:
            if not ok:
                sock.close()


class _Pool:
    """consume's workers: each takes a message, runs the handler, settles the
    message, until the client is closed."""

    def __init__(self, client: Client, handler: Callable[[Message], object]) -> None:
        self.client = client
        self.handler = handler
        self._cond = threading.Condition()
        self._running = 0  # workers in work
        self._done = 0  # workers that returned

    def wait(self, done: int) -> None:
        """Waits until done workers have returned and none runs (done 0: none runs)."""
        with self._cond:
            while self._running > 0 or self._done < done:
                self._cond.wait()

    def work(self) -> None:
        with self._cond:
            self._running += 1
        try:
            self._work()
        finally:
            with self._cond:
                self._running -= 1
                self._done += 1
                self._cond.notify_all()

    def _work(self) -> None:
        c = self.client
        while True:
            try:
                m = c.get()
            except FanoutError:
                return  # closed, or given up: consume raises the error
            if m is None:
                continue
            err: Optional[BaseException] = None
            try:
                self.handler(m)
            except Exception as e:  # noqa: BLE001 - a handler's failure nacks its message
                err = e
            settle(m, err, c.log)


class _Link(LinkBase[Session]):
    """A link (see _core.LinkBase) whose steps its thread carries out."""

    def __init__(self, client: Client, member: str, credit: int) -> None:
        super().__init__(client, member, credit)
        self._client = client
        self._wait = threading.Event()  # set to interrupt a backoff
        self.thread = threading.Thread(target=self._run, name=f"fanout-link-{member or 'cluster'}", daemon=True)

    def _interrupt(self) -> None:
        self._wait.set()  # a connection attempt sees stopping or the client closing within 0.25 s

    def _run(self) -> None:
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
                    result = self._do(step)
                except Exception as e:  # noqa: BLE001 - a failed attempt goes back into the steps
                    failure = e
        finally:
            self.client._link_exited(self)

    def _do(self, step: Step) -> Any:
        if isinstance(step, Wait):
            self._wait.wait(step.seconds)
            return None
        if isinstance(step, Connect):
            return self._client._connect(self, step.addr, step.credit)
        assert isinstance(step, Serve)
        return step.session.run()


def connect(
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
    """Returns a connected Client (see :class:`Client` for the arguments and
    :meth:`Client.connect` for timeout and errors)."""
    return Client(
        addrs, client_id=client_id, max_in_flight=max_in_flight, auth_token=auth_token, ssl_context=ssl_context,
        connect_timeout=connect_timeout, reconnect=reconnect, min_backoff=min_backoff, max_backoff=max_backoff,
        max_frame_size=max_frame_size, batch=batch, logger=logger,
    ).connect(timeout)
