"""The fanout client: sessions with the daemons of one cluster, their
messages merged into one iterator."""

from __future__ import annotations

import collections
import logging
import socket
import ssl
import threading
import time
from typing import Callable, Deque, Iterator, List, Optional, Sequence, Tuple, Union

from . import _state, _wire
from ._members import Following
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
from ._redial import Redial
from ._session import Session
from ._state import Version
from .errors import ClosedError, ConnectError, FanoutError
from .message import Message

__all__ = ["Client", "connect"]


class Client:
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
        self.opts = Options(
            addrs, client_id=client_id, max_in_flight=max_in_flight, auth_token=auth_token, ssl_context=ssl_context,
            connect_timeout=connect_timeout, reconnect=reconnect, min_backoff=min_backoff, max_backoff=max_backoff,
            max_frame_size=max_frame_size, batch=batch, logger=logger,
        )
        self.addrs: List[str] = self.opts.addrs
        self.client_id: str = self.opts.client_id
        self.max_in_flight = max_in_flight
        self.log = self.opts.log

        self._cond = threading.Condition()  # guards the fields below
        self._queue: Deque[Message] = collections.deque()
        self._links: List[_Link] = []
        self._following = Following(max_in_flight, self.log)
        self._started = False
        self._welcomed = False
        self._error: Optional[BaseException] = None  # why the client stopped on its own
        self._last_error: Optional[BaseException] = None  # the last connection failure

        self._closing = threading.Event()  # close() or a link gave up
        self._drain = 0.0

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
        workers = [
            threading.Thread(target=self._work, args=(handler,), name=f"fanout-worker-{i}", daemon=True)
            for i in range(concurrency)
        ]
        for w in workers:
            w.start()
        try:
            for w in workers:
                w.join()
        except BaseException:
            self.close()
            for w in workers:
                w.join()
            raise
        if self._error is not None:
            raise self._error

    def _work(self, handler: Callable[[Message], object]) -> None:
        while True:
            try:
                m = self.get()
            except FanoutError:
                return  # closed, or given up: consume raises the error
            if m is None:
                continue
            err: Optional[BaseException] = None
            try:
                handler(m)
            except Exception as e:  # noqa: BLE001 - a handler's failure nacks its message
                err = e
            settle(m, err, self.log)

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
        with self._cond:
            if not self._closing.is_set():
                self._drain = drain
                self._closing.set()
            links = list(self._links)
            self._cond.notify_all()
        for link in links:
            link.wake()
        for link in links:
            if link.thread is not threading.current_thread():
                link.thread.join()

    def __enter__(self) -> "Client":
        if not self._started:
            self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def error(self) -> Optional[BaseException]:
        """Why the client stopped on its own (a permanent error from the
        daemon, a frame above max_frame_size, or a lost connection without
        reconnect), or None."""
        with self._cond:
            return self._error

    @property
    def members(self) -> List[str]:
        """The members the client keeps a session with (spread mode), sorted:
        the latest list a daemon sent. Empty in leader mode."""
        with self._cond:
            return list(self._following.members)

    # ------------------------------------------------------------ sessions' side

    def _put(self, m: Message) -> None:
        with self._cond:
            self._queue.append(m)
            self._cond.notify()

    def _drop_queued(self, s: Session) -> None:
        """Drops the messages of s not yet handed to the user; the daemon
        delivers them again once s has ended."""
        with self._cond:
            mine = [m for m in self._queue if m._session is s]
            if mine:
                self._queue = collections.deque(m for m in self._queue if m._session is not s)
        for m in mine:
            s.release(m)

    def _start_link(self, member: str, credit: int) -> "_Link":
        """Starts a link; self._cond must be held."""
        link = _Link(self, member, credit)
        self._links.append(link)
        link.thread.start()
        return link

    def _welcomed_by(self, link: "_Link", s: Session) -> None:
        with self._cond:
            self._welcomed = True
            self._cond.notify_all()
        addrs, version = _state.members_of(s.welcome)
        self._follow_members(link, addrs, version, welcome=True)

    def _gave_up(self, err: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = err
            self._closing.set()
            links = list(self._links)
            self._cond.notify_all()
        self.log.error("fanout client gives up: %s", err)
        for link in links:
            link.wake()

    def _link_exited(self, link: "_Link") -> None:
        with self._cond:
            if link in self._links:
                self._links.remove(link)
            self._cond.notify_all()

    def _follow_members(
        self, src: "_Link", addrs: List[str], version: Optional[Version] = None, welcome: bool = False
    ) -> None:
        """Applies a member list src's session received (see Following.follow)."""
        with self._cond:
            self._following.follow(src, addrs, version, welcome, list(self._links), self._start_link,
                                   self._closing.is_set())

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


class _Link:
    """Keeps one session open: with one member in spread mode, or with the
    cluster (the client's addrs, following redirects) in leader mode. Its
    thread connects, runs the session and reconnects with backoff (see
    _redial.Redial) until the client closes, the link is stopped, or it
    gives up."""

    def __init__(self, client: Client, member: str, credit: int) -> None:
        self.client = client
        self.member = member  # "" for the cluster link
        self.credit = credit  # Hello.max_in_flight of the next session
        self.session: Optional[Session] = None
        self.stopping = False
        self._wait = threading.Event()  # set to interrupt a backoff
        self.thread = threading.Thread(target=self._run, name=f"fanout-link-{member or 'cluster'}", daemon=True)

    def session_addr(self) -> Optional[str]:
        s = self.session
        return s.addr if s is not None else None

    def wake(self) -> None:
        """Interrupts a backoff and wakes the session (the client closes)."""
        self._wait.set()
        s = self.session
        if s is not None:
            s.signal()

    def stop(self) -> None:
        """Retires the link's session and ends the link after it."""
        self.stopping = True
        self._wait.set()
        s = self.session
        if s is not None:
            s.retire()

    def set_credit(self, credit: int) -> None:
        """A session that asked for another credit is retired and opened
        again with this one."""
        self.credit = credit
        s = self.session
        if s is not None and s.credit != credit:
            s.retire()

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self.client._link_exited(self)

    def _serve(self) -> None:
        c = self.client
        redial = Redial(c.opts)
        wait: Optional[float] = 0.0
        while True:
            if wait:
                self._wait.wait(wait)
            if c._closing.is_set() or self.stopping:
                return
            addrs = [self.member] if self.member else c.addrs
            addr = redial.target(addrs)
            credit = self.credit
            try:
                s = c._connect(self, addr, credit)
            except Exception as err:  # noqa: BLE001 - every failure is retried or reported
                if c._closing.is_set() or self.stopping:
                    return
                with c._cond:
                    c._last_error = err
                c.log.warning("connection attempt to %s failed: %s", addr, err)
                wait = redial.failed(err, addrs)
                if wait is None:
                    c._gave_up(err)
                    return
                continue
            redial.welcomed()
            w = s.welcome
            c.log.info(
                "connected to %s (node %s, max_in_flight %d, heartbeat %d ms, topic %s, %d members)",
                addr, w.node_id, w.max_in_flight, w.heartbeat_ms, w.topic, len(w.members),
            )
            self.session = s
            if self.stopping or self.credit != credit:
                s.retire()
            c._welcomed_by(self, s)
            began = time.monotonic()
            ended = s.run()
            self.session = None
            if c._closing.is_set():
                return
            if self.stopping:
                c.log.info("session with %s retired: no longer needed", s.addr)
                return
            if s.retired():
                c.log.info("reconnecting to %s with a new share of the credit: %d", s.addr, self.credit)
                redial.retired(s.addr)
                wait = 0.0
                continue
            c.log.warning("disconnected from %s: %s", s.addr, ended)
            wait = redial.ended(ended, s.addr, time.monotonic() - began, addrs)
            if wait is None:
                c._gave_up(ended)
                return


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
