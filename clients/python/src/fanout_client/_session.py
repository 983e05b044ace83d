"""One welcomed connection to a daemon, served by one thread.

The thread that runs a session is the only one touching its socket (an
``ssl.SSLSocket`` must not be read and written by two threads at once): it
waits in ``select`` for the socket or a wake-up, reads the frames that have
arrived, then writes everything queued meanwhile. ``ack``, ``nack`` and
``touch``, from any thread, queue the delivery id and wake it, so acks are
batched on the wire without a timer: an idle client sends an ack at once, a
busy one many in one frame and one system call. The protocol state is
``_state.SessionState``, shared with the asyncio client, under the session's
lock.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING, List, Optional

from . import _state, _wire
from ._proto import fanout_pb2 as pb
from ._core import log_of
from ._state import SessionState, StaleError
from .errors import ClosedError, ConnectionLostError, DaemonSilentError
from .message import BaseMessage, Message

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client, _Link

_READ_SIZE = 256 * 1024


class Session:
    """One welcomed connection. ``run`` serves it until it ends."""

    def __init__(
        self,
        client: "Client",
        link: "_Link",
        sock: socket.socket,
        addr: str,
        reader: _wire.FrameReader,
        welcome: pb.Welcome,
        credit: int,
        pending: List[pb.Frame],
    ) -> None:
        self.client = client
        self.link = link
        self.sock = sock
        self.addr = addr
        self.welcome = welcome
        self.credit = credit
        self.state = SessionState(client.opts, addr, welcome, credit)
        self.log = log_of(client.log, self.state)
        self._reader = reader
        self._pending = pending  # frames read with the Welcome

        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

        self._lock = threading.Lock()  # guards self.state and _woken
        self._woken = False
        self._closing = False  # Goodbye sent: read until the daemon closes
        self._linger_until = 0.0

    # ------------------------------------------------------------ other threads

    def finish(self, msg: BaseMessage, op: int, delay_ms: int, reason: str) -> None:
        """Queues msg's ack (op OP_ACK) or nack; see Message.ack."""
        with self._lock:
            self.state.finish(msg, op, delay_ms, reason)
        self.signal()

    def touch(self, msg: BaseMessage) -> None:
        """Queues msg's touch; see Message.touch."""
        with self._lock:
            self.state.touch(msg)
        self.signal()

    def release(self, msg: BaseMessage) -> None:
        """Gives back msg, passed on but dropped before the user took it (see
        SessionState.release)."""
        with self._lock:
            self.state.release(msg)
        self.signal()

    def usable(self) -> bool:
        """Whether a message of this session is worth handing to the user."""
        with self._lock:
            return self.state.usable()

    def retire(self, drain_timeout: Optional[float] = None) -> None:
        """Ends the session without losing work and without duplicates (see
        SessionState.retire): no more deliveries are passed on, and once
        every message passed on is acked or nacked (or the drain timeout has
        passed) the queued acks and a Goodbye are sent. It may be called more
        than once, from any thread."""
        with self._lock:
            self.state.retire(time.monotonic(), drain_timeout)
        self.client._drop_queued(self)
        self.signal()

    def retired(self) -> bool:
        with self._lock:
            return self.state.draining

    def signal(self) -> None:
        """Wakes the session's thread."""
        with self._lock:
            if self._woken:
                return
            self._woken = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # closed: the session is over

    # ------------------------------------------------------------ the session's thread

    def run(self) -> BaseException:
        """Serves the session until it ends; returns why."""
        err: BaseException
        try:
            err = self._loop()
        except BaseException as e:  # noqa: BLE001 - every failure ends the session
            err = e
        with self._lock:
            self.state.end(err)
        try:
            self.sock.close()
        finally:
            self._wake_r.close()
            self._wake_w.close()
        self.client._drop_queued(self)
        return err

    def _loop(self) -> BaseException:
        last_read = time.monotonic()
        for f in self._pending:
            self._handle(f)
        self._pending = []
        self._write()
        liveness = self.state.liveness
        while True:
            now = time.monotonic()
            if not self._closing:
                if self.client._closing.is_set():
                    drain = self.client._drain
                    if drain > 0 and not self.retired():
                        self.retire(drain)
                    elif drain <= 0:
                        self._goodbye(ClosedError("client closed"), "client closing")
                        continue
                with self._lock:
                    due, held = self.state.goodbye_due(now), self.state.held
                if due:
                    if held > 0:
                        self.log.warning("retired session with %s: %d messages not acked in time; they come again",
                                         self.addr, held)
                    closing = self.client._closing.is_set()
                    self._goodbye(ClosedError("client closed") if closing else StaleError("session retired"),
                                  "client closing" if closing else "session retired")
                    continue
            timeout: Optional[float] = None
            if self._closing:
                timeout = self._linger_until - now
                if timeout <= 0:
                    return ClosedError("client closed")
            else:
                if liveness is not None:
                    timeout = last_read + liveness - now
                    if timeout <= 0:
                        raise DaemonSilentError(f"daemon {self.addr} silent for more than {liveness:.1f}s")
                with self._lock:
                    deadline = self.state.drain_deadline if self.state.draining else None
                if deadline is not None:
                    timeout = max(0.0, deadline - now) if timeout is None else min(timeout, max(0.0, deadline - now))
            readable: List[socket.socket]
            if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
                readable = [self.sock]
            else:
                readable, _, _ = select.select([self.sock, self._wake_r], [], [], timeout)
            if self._wake_r in readable:
                # Drained first, then the flag reset: a signal in between sends no byte, and what it queued
                # is written below; one after the reset sends a byte this loop has not drained.
                try:
                    self._wake_r.recv(4096)
                except BlockingIOError:
                    pass
                with self._lock:
                    self._woken = False
            if self.sock in readable:
                data = self._recv()
                if data is None:
                    pass  # a TLS record not complete yet
                elif not data:
                    if self._closing:
                        return ClosedError("client closed")
                    raise ConnectionLostError(f"connection closed by {self.addr}")
                else:
                    last_read = time.monotonic()
                    for f in self._reader.feed(data):
                        if not self._closing:
                            self._handle(f)
            if not self._closing:
                self._write()

    def _recv(self) -> Optional[bytes]:
        self.sock.settimeout(0)
        try:
            return self.sock.recv(_READ_SIZE)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return None
        except OSError as e:
            if self._closing:
                return b""
            raise ConnectionLostError(f"read from {self.addr}: {e}") from e

    def _handle(self, f: pb.Frame) -> None:
        with self._lock:
            deliveries, members = self.state.handle(f, self.log)
        for d in deliveries:
            self.client._put(Message._of(d, self))
        if members is not None:
            self.client._follow_members(self.link, members[0], members[1])

    def _write(self) -> None:
        with self._lock:
            data = self.state.take()
        if data:
            self._send(data)

    def _send(self, data: bytes) -> None:
        self.sock.settimeout(self.state.write_timeout)
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise ConnectionLostError(f"write to {self.addr}: {e}") from e

    def _goodbye(self, ended: BaseException, reason: str) -> None:
        """Stops the queueing of ids (ack and friends raise from now on),
        sends what was queued and a Goodbye, and lets the loop read until the
        daemon closes (at most LINGER_TIMEOUT)."""
        with self._lock:
            data = self.state.goodbye(ended, reason)
        self._send(data)
        self._closing = True
        self._linger_until = time.monotonic() + _state.LINGER_TIMEOUT
        if not isinstance(self.sock, ssl.SSLSocket):
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
