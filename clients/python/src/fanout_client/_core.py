"""What both clients share above the protocol: a client's bookkeeping (the
queue of messages, the links, the member list followed, why it stopped) and
a link's life (connect, serve the session, reconnect with backoff), written
once as a generator of steps that each client carries out its own way (a
thread's blocking calls, a task's awaits)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, ContextManager, Deque, Generator, Generic, List, NamedTuple, Optional, Protocol, TypeVar, Union

from ._members import Following
from ._options import Options
from ._redial import Redial
from ._state import SessionState, Version, members_of
from .message import BaseMessage


class SessionLike(Protocol):
    """A welcomed session as the shared code sees it (both clients' Session)."""

    addr: str
    credit: int
    state: SessionState

    def retire(self, drain_timeout: Optional[float] = None) -> None: ...

    def retired(self) -> bool: ...

    def finish(self, msg: BaseMessage, op: int, delay_ms: int, reason: str) -> None: ...

    def touch(self, msg: BaseMessage) -> None: ...

    def release(self, msg: BaseMessage) -> None: ...

    def signal(self) -> None: ...


M = TypeVar("M", bound=BaseMessage)
S = TypeVar("S", bound=SessionLike)
L = TypeVar("L", bound="LinkBase[Any]")


class ClientBase(Generic[M, S, L]):
    """A client's state and the rules on it that do not wait. A subclass
    says how the state is guarded (``_locked``: the threaded client's
    condition; nothing for the asyncio client, whose state only its event
    loop touches) and who is told of a change (``_notify``, called guarded)."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.addrs: List[str] = opts.addrs
        self.client_id: str = opts.client_id
        self.max_in_flight = opts.max_in_flight
        self.log = opts.log
        self._queue: Deque[M] = collections.deque()
        self._links: List[L] = []
        self._following = Following(opts.max_in_flight, self.log)
        self._welcomed = False
        self._error: Optional[BaseException] = None  # why the client stopped on its own
        self._last_error: Optional[BaseException] = None  # the last connection failure
        self._closing = threading.Event()  # close() or a link gave up
        self._drain = 0.0

    # ------------------------------------------------------------ what a subclass says

    def _locked(self) -> ContextManager[Any]:
        raise NotImplementedError

    def _notify(self) -> None:
        """Wakes whoever waits for a change (called guarded)."""
        raise NotImplementedError

    def _new_link(self, member: str, credit: int) -> L:
        """A started link (called guarded)."""
        raise NotImplementedError

    def _arrived(self) -> None:
        """Wakes one waiter for a message (called guarded); by default, everyone."""
        self._notify()

    # ------------------------------------------------------------ shared

    @property
    def error(self) -> Optional[BaseException]:
        """Why the client stopped on its own (a permanent error from the
        daemon, a frame above max_frame_size, or a lost connection without
        reconnect), or None."""
        with self._locked():
            return self._error

    @property
    def members(self) -> List[str]:
        """The members the client keeps a session with (spread mode), sorted:
        the latest list a daemon sent. Empty in leader mode."""
        with self._locked():
            return list(self._following.members)

    def _start_link(self, member: str, credit: int) -> L:
        link = self._new_link(member, credit)
        self._links.append(link)
        return link

    def _close_links(self, drain: float) -> List[L]:
        """Marks the client closing (with a drain of drain seconds, unless it
        already is) and wakes its links; returns them."""
        with self._locked():
            if not self._closing.is_set():
                self._drain = drain
                self._closing.set()
            links = list(self._links)
            self._notify()
        for link in links:
            link.wake()
        return links

    def _put(self, m: M) -> None:
        with self._locked():
            self._queue.append(m)
            self._arrived()

    def _drop_queued(self, s: S) -> None:
        """Drops the messages of s not yet handed to the user; the daemon
        delivers them again once s has ended."""
        with self._locked():
            mine = [m for m in self._queue if m._session is s]
            if mine:
                self._queue = collections.deque(m for m in self._queue if m._session is not s)
        for m in mine:
            s.release(m)

    def _welcomed_by(self, link: L, s: S) -> None:
        with self._locked():
            self._welcomed = True
            self._notify()
        addrs, version = members_of(s.state.welcome)
        self._follow_members(link, addrs, version, welcome=True)

    def _attempt_failed(self, err: BaseException) -> None:
        with self._locked():
            self._last_error = err

    def _gave_up(self, err: BaseException) -> None:
        with self._locked():
            if self._error is None:
                self._error = err
            self._closing.set()
            links = list(self._links)
            self._notify()
        self.log.error("fanout client gives up: %s", err)
        for link in links:
            link.wake()

    def _link_exited(self, link: L) -> None:
        with self._locked():
            if link in self._links:
                self._links.remove(link)
            self._notify()

    def _follow_members(self, src: L, addrs: List[str], version: Optional[Version] = None, welcome: bool = False) -> None:
        """Applies a member list src's session received (see Following.follow)."""
        with self._locked():
            self._following.follow(src, addrs, version, welcome, list(self._links), self._start_link,
                                   self._closing.is_set())


class Wait(NamedTuple):
    """A link's step: wait this long, or until woken."""

    seconds: float


class Connect(NamedTuple):
    """A link's step: connect to addr, asking for credit; its result is the
    welcomed session, or the failure is thrown into the steps."""

    addr: str
    credit: int


class Serve(NamedTuple):
    """A link's step: serve the session until it ends; its result is why."""

    session: Any


Step = Union[Wait, Connect, Serve]


class LinkBase(Generic[S]):
    """Keeps one session open: with one member in spread mode, or with the
    cluster (the client's addrs, following redirects) in leader mode. Its
    life is ``steps``: connect, serve the session, reconnect with backoff
    (see _redial.Redial) until the client closes, the link is stopped, or it
    gives up. A subclass carries the steps out and says how to interrupt a
    wait or a connection attempt (``_interrupt``)."""

    def __init__(self, client: "ClientBase[Any, S, Any]", member: str, credit: int) -> None:
        self.client = client
        self.member = member  # "" for the cluster link
        self.credit = credit  # Hello.max_in_flight of the next session
        self.session: Optional[S] = None
        self.stopping = False

    def _interrupt(self) -> None:
        raise NotImplementedError

    def session_addr(self) -> Optional[str]:
        s = self.session
        return s.addr if s is not None else None

    def wake(self) -> None:
        """Interrupts a backoff or a connection attempt and wakes the session (the client closes)."""
        self._interrupt()
        s = self.session
        if s is not None:
            s.signal()

    def stop(self) -> None:
        """Retires the link's session and ends the link after it."""
        self.stopping = True
        self._interrupt()
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

    def _over(self) -> bool:
        return self.client._closing.is_set() or self.stopping

    def steps(self) -> Generator[Step, Any, None]:
        """The link's life, as the steps to carry out."""
        c = self.client
        redial = Redial(c.opts)
        wait: Optional[float] = 0.0
        while True:
            if wait:
                yield Wait(wait)
            if self._over():
                return
            addrs = [self.member] if self.member else c.addrs
            addr = redial.target(addrs)
            credit = self.credit
            try:
                s: S = yield Connect(addr, credit)
            except Exception as err:  # noqa: BLE001 - every failure is retried or reported
                if self._over():
                    return
                c._attempt_failed(err)
                c.log.warning("connection attempt to %s failed: %s", addr, err)
                wait = redial.failed(err, addrs)
                if wait is None:
                    c._gave_up(err)
                    return
                continue
            redial.welcomed()
            w = s.state.welcome
            c.log.info(
                "connected to %s (node %s, max_in_flight %d, heartbeat %d ms, topic %s, %d members)",
                addr, w.node_id, w.max_in_flight, w.heartbeat_ms, w.topic, len(w.members),
            )
            self.session = s
            if self.stopping or self.credit != credit:
                s.retire()
            c._welcomed_by(self, s)
            began = time.monotonic()
            ended: BaseException = yield Serve(s)
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


def log_of(log: logging.Logger, s: SessionState) -> "logging.LoggerAdapter[logging.Logger]":
    """A session's logger: the client's, with the session's address, node and id."""
    return logging.LoggerAdapter(log, {"addr": s.addr, "node": s.welcome.node_id, "session": s.welcome.session_id})
