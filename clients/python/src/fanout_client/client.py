"""The fanout client: sessions with the daemons of one cluster, their
messages merged into one iterator."""

from __future__ import annotations

import collections
import logging
import os
import random
import socket
import ssl
import threading
import time
from typing import Deque, Iterator, List, Optional, Sequence, Tuple, Union

from . import _wire
from ._proto import fanout_pb2 as pb
from ._session import RedirectError, Session
from .errors import ClosedError, ConnectError, FanoutError, RemoteError, is_permanent, retry_after
from .message import Message

__all__ = ["Client", "connect"]

#: Defaults of the Client's arguments.
DEFAULT_MAX_IN_FLIGHT = 64
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_MIN_BACKOFF = 0.1
DEFAULT_MAX_BACKOFF = 5.0

# Bounds the Redirect frames followed in one connection attempt.
_MAX_REDIRECTS = 5
# How long a session must last for the reconnect backoff to start over.
_STABLE_SESSION = 2.0


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
        self.addrs: List[str] = [addrs] if isinstance(addrs, str) else list(addrs)
        if not self.addrs or any(not a for a in self.addrs):
            raise ValueError("fanout client: no daemon address given")
        for a in self.addrs:
            _split_addr(a)
        if not 1 <= max_in_flight <= 1 << 20:
            raise ValueError(f"fanout client: max_in_flight {max_in_flight} out of range 1..{1 << 20}")
        if not _wire.MAX_HELLO_SIZE <= max_frame_size <= _wire.MAX_FRAME_SIZE_LIMIT:
            raise ValueError(
                f"fanout client: max_frame_size {max_frame_size} out of range "
                f"{_wire.MAX_HELLO_SIZE}..{_wire.MAX_FRAME_SIZE_LIMIT}"
            )
        if connect_timeout <= 0:
            raise ValueError(f"fanout client: connect_timeout {connect_timeout} must be positive")
        self.client_id = client_id or f"{socket.gethostname()}-{os.getpid()}"
        self.max_in_flight = max_in_flight
        self.auth_token = auth_token
        self.ssl_context = ssl_context
        self.connect_timeout = connect_timeout
        self.reconnect = reconnect
        self.min_backoff = max(min_backoff, 0.001)
        self.max_backoff = max(max_backoff, self.min_backoff)
        self.max_frame_size = max_frame_size
        self.batch = batch
        self.log = logger or logging.getLogger("fanout_client")

        self._cond = threading.Condition()  # guards the fields below
        self._queue: Deque[Message] = collections.deque()
        self._links: List[_Link] = []
        self._members: List[str] = []
        # The (epoch, generation) of the member list followed; None: none.
        self._version: Optional[Tuple[int, int]] = None
        self._started = False
        self._welcomed = False
        self._error: Optional[BaseException] = None  # why the client stopped on its own
        self._last_error: Optional[BaseException] = None  # the last connection failure
        self._stopped = False  # every link has exited

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
            assert s is not None
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

    def close(self, drain: float = 0.0) -> None:
        """Closes every session: sends the acks queued so far and a Goodbye,
        waits for the daemons to close the connections (a couple of seconds
        at most) and stops reconnecting. Messages not acked by then come
        again, to other clients; their ack() returns False.

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
            return list(self._members)

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

    def _backoff(self, n: int) -> float:
        """The wait before attempt n+1 after n failures: exponential from
        min_backoff, capped at max_backoff, the upper half jittered."""
        d = self.max_backoff
        if n - 1 < 62:
            d = min(self.max_backoff, self.min_backoff * (2 ** (n - 1)))
        return d / 2 + random.uniform(0, d / 2)

    def _welcomed_by(self, link: "_Link", s: Session) -> None:
        with self._cond:
            self._welcomed = True
            self._cond.notify_all()
        self._follow_members(
            link, [m.address for m in s.welcome.members], _wire.members_version(s.welcome, "members_version"), welcome=True
        )

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
        self, src: "_Link", addrs: List[str], version: Optional[Tuple[int, int]] = None, welcome: bool = False
    ) -> None:
        """Applies a member list of the given (epoch, generation) version
        that src's session received (in its Welcome when welcome): an empty
        list means leader mode (src becomes the one link, with all the
        credit); otherwise one link per member, each with its share, links of
        members no longer listed are retired, and the cluster link becomes
        the link of the member it is connected to, or retires.

        A list older than the one followed (a lower version, or none in a
        Members frame while the client holds one) is ignored: members may
        disagree for a moment while an assignment spreads. A Welcome without
        a version is leader mode, or an older daemon: followed."""
        if src.stopping:
            return  # its member left: its view is not the one to follow
        new = sorted(set(a for a in addrs if a))
        with self._cond:
            held = self._version
            if held is not None and ((version is None and not welcome) or (version is not None and version < held)):
                self.log.debug("ignoring member list %s of version %s from %s: following %s", new, version, src.member, held)
                return
            self._version = version
            if new == self._members or self._closing.is_set():
                return
            self._members = new
            links = list(self._links)
            if not new:
                self.log.info("no members listed: one session, to the leader")
                src.member = ""
                src.set_credit(self.max_in_flight)
                for link in links:
                    if link is not src:
                        link.stop()
                return
            credit = max(1, self.max_in_flight // len(new)) if len(new) > 1 else self.max_in_flight
            self.log.info("members changed: one session per member of %s, max_in_flight %d each", new, credit)
            by_member = {}
            leaving, clusters = [], []
            for link in links:
                if link.stopping:
                    continue
                if link.member == "":
                    clusters.append(link)
                elif link.member in new and link.member not in by_member:
                    by_member[link.member] = link
                else:
                    leaving.append(link)
            for link in clusters:
                s = link.session
                if s is not None and s.addr in new and s.addr not in by_member:
                    link.member = s.addr
                    by_member[s.addr] = link
                else:
                    leaving.append(link)
            # Leavers first: a member no longer listed passes nothing more on.
            for link in leaving:
                link.stop()
            for addr in new:
                if addr in by_member:
                    by_member[addr].set_credit(credit)
            for addr in new:
                if addr not in by_member:
                    self._start_link(addr, credit)

    # ------------------------------------------------------------ connecting

    def _connect(self, link: "_Link", addr: str, credit: int) -> Session:
        """Connects to addr for link, following up to _MAX_REDIRECTS redirects."""
        for hop in range(_MAX_REDIRECTS + 1):
            s, redirect = self._handshake(link, addr, credit)
            if s is not None:
                return s
            self.log.info("redirected from %s to the leader at %s", addr, redirect)
            addr = redirect
        raise FanoutError(f"more than {_MAX_REDIRECTS} redirects, last to {addr}")

    def _handshake(self, link: "_Link", addr: str, credit: int) -> Tuple[Optional[Session], str]:
        """Dials addr, sends Hello and reads the answer: a session for a
        Welcome, the leader's address for a Redirect, or an error."""
        host, port = _split_addr(addr)
        deadline = time.monotonic() + self.connect_timeout
        try:
            raw = socket.create_connection((host, port), timeout=self.connect_timeout)
        except OSError as e:
            raise ConnectionError(f"dial {addr}: {e}") from e
        sock: socket.socket = raw
        ok = False
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.ssl_context is not None:
                try:
                    sock = self.ssl_context.wrap_socket(raw, server_hostname=host)
                except (OSError, ssl.SSLError) as e:
                    raise ConnectionError(f"TLS handshake with {addr}: {e}") from e
            caps = [_wire.CAPABILITY_MEMBERS] + ([_wire.CAPABILITY_BATCH] if self.batch else [])
            hello = pb.Frame(
                hello=pb.Hello(
                    client_id=self.client_id,
                    protocol_version=_wire.PROTOCOL_VERSION,
                    max_in_flight=credit,
                    auth_token=self.auth_token,
                    max_frame_size=self.max_frame_size,
                    capabilities=caps,
                )
            )
            try:
                sock.sendall(_wire.encode(hello, _wire.MAX_HELLO_SIZE))
            except OSError as e:
                raise ConnectionError(f"hello to {addr}: {e}") from e
            reader = _wire.FrameReader(self.max_frame_size)
            frames: List[pb.Frame] = []
            while True:
                while not frames:
                    left = deadline - time.monotonic()
                    if left <= 0 or link.stopping or self._closing.is_set():
                        raise ConnectionError(f"handshake with {addr}: no answer in {self.connect_timeout}s")
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
                f = frames.pop(0)
                kind = f.WhichOneof("body")
                if kind == "welcome":
                    s = Session(self, link, sock, addr, reader, f.welcome, credit, frames)
                    ok = True
                    return s, ""
                if kind == "redirect":
                    to = f.redirect.leader_address
                    if not to:
                        raise ConnectionError(f"handshake with {addr}: redirect without a leader address")
                    return None, to
                if kind == "error":
                    raise RemoteError.from_frame(f.error, addr)
                if kind in ("ping", "pong"):
                    continue  # too early to answer; the Welcome follows
                raise ConnectionError(f"handshake with {addr}: unexpected {kind} frame")
        finally:
            if not ok:
                sock.close()


class _Link:
    """Keeps one session open: with one member in spread mode, or with the
    cluster (the client's addrs, following redirects) in leader mode. Its
    thread connects, runs the session and reconnects with backoff until the
    client closes, the link is stopped, or it gives up."""

    def __init__(self, client: Client, member: str, credit: int) -> None:
        self.client = client
        self.member = member  # "" for the cluster link
        self.credit = credit  # Hello.max_in_flight of the next session
        self.session: Optional[Session] = None
        self.stopping = False
        self._wait = threading.Event()  # set to interrupt a backoff
        self.thread = threading.Thread(target=self._run, name=f"fanout-link-{member or 'cluster'}", daemon=True)

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
        prefer = ""
        nxt = 0
        failures = 0
        connected = False
        wait = 0.0
        while True:
            if wait > 0:
                self._wait.wait(wait)
            if c._closing.is_set() or self.stopping:
                return
            addrs = [self.member] if self.member else c.addrs
            addr = prefer
            prefer = ""
            if not addr:
                addr = addrs[nxt % len(addrs)]
                nxt += 1
            credit = self.credit
            try:
                s = c._connect(self, addr, credit)
            except Exception as err:  # noqa: BLE001 - every failure is retried or reported
                if c._closing.is_set() or self.stopping:
                    return
                with c._cond:
                    c._last_error = err
                c.log.warning("connection attempt to %s failed: %s", addr, err)
                failures += 1
                if is_permanent(err) or (not c.reconnect and (connected or failures >= len(addrs))):
                    c._gave_up(err)
                    return
                wait = retry_after(err) or c._backoff(failures)
                continue
            connected = True
            c.log.info(
                "connected to %s (node %s, max_in_flight %d, heartbeat %d ms, topic %s, %d members)",
                addr, s.welcome.node_id, s.welcome.max_in_flight, s.welcome.heartbeat_ms,
                s.welcome.topic, len(s.welcome.members),
            )
            self.session = s
            if self.stopping or self.credit != credit:
                s.retire()
            c._welcomed_by(self, s)
            began = time.monotonic()
            err = s.run()
            self.session = None
            if c._closing.is_set():
                return
            if self.stopping:
                c.log.info("session with %s retired: no longer needed", s.addr)
                return
            if s.retired():
                c.log.info("reconnecting to %s with a new share of the credit: %d", s.addr, self.credit)
                prefer, failures, wait = s.addr, 0, 0.0
                continue
            c.log.warning("disconnected from %s: %s", s.addr, err)
            prefer = s.addr
            if retry_after(err) > 0 and len(addrs) > 1:
                prefer = ""  # that daemon stopped leading: the next leader is more likely another
            if isinstance(err, RedirectError):
                prefer = err.addr
            if is_permanent(err) or not c.reconnect:
                c._gave_up(err)
                return
            if time.monotonic() - began >= _STABLE_SESSION:
                failures = 0
            failures += 1
            wait = retry_after(err) or c._backoff(failures)


def _split_addr(addr: str) -> Tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"fanout client: address {addr!r} is not host:port")
    return host.strip("[]"), int(port)


def connect(addrs: Union[str, Sequence[str]], timeout: Optional[float] = 30.0, **kwargs: object) -> Client:
    """Returns a connected Client (see :class:`Client` for the arguments and
    :meth:`Client.connect` for timeout and errors)."""
    return Client(addrs, **kwargs).connect(timeout)  # type: ignore[arg-type]
