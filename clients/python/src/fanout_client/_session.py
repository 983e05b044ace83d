"""One welcomed connection to a daemon, served by one thread.

The thread that runs a session is the only one touching its socket (an
``ssl.SSLSocket`` must not be read and written by two threads at once): it
waits in ``select`` for the socket or a wake-up, reads the frames that have
arrived, then writes everything queued meanwhile. ``ack``, ``nack`` and
``touch``, from any thread, queue the delivery id and wake it, so acks are
batched on the wire without a timer: an idle client sends an ack at once, a
busy one many in one frame and one system call.
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

from . import _wire
from ._proto import fanout_pb2 as pb
from .errors import AlreadyAckedError, ClosedError, ConnectionLostError, DaemonSilentError, RemoteError
from .message import OP_ACK, OP_NACK, OP_TOUCH, Header, Message

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client, _Link

# How long close waits, after its Goodbye, for the daemon to close the connection.
LINGER_TIMEOUT = 2.0
# Used when a Welcome gives a heartbeat but no liveness_intervals.
_DEFAULT_LIVENESS_INTERVALS = 3
# The reason of the nacks of deliveries a retiring session gives back.
RETIRING_REASON = "client session retiring: not processed"

# Bounds a retiring session's wait for its messages when the Welcome gives no ack timeout.
_DEFAULT_DRAIN_TIMEOUT = 30.0
_READ_SIZE = 256 * 1024


class StaleError(ConnectionLostError):
    """The session ended; its messages can no longer be acked."""


class RedirectError(ConnectionLostError):
    """The daemon redirected a welcomed session to the leader at addr."""

    def __init__(self, addr: str) -> None:
        super().__init__(f"redirected to {addr}")
        self.addr = addr


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
        self.log = logging.LoggerAdapter(
            client.log, {"addr": addr, "node": welcome.node_id, "session": welcome.session_id}
        )
        self._reader = reader
        self._pending = pending  # frames read with the Welcome
        max_frame = welcome.max_frame_size or client.max_frame_size
        self.max_frame = min(max_frame, client.max_frame_size)
        self.max_ids = _wire.ids_per_frame(self.max_frame, welcome.max_in_flight)
        # Ranges only to a daemon that confirmed the capability.
        self.ranges = client.batch and _wire.CAPABILITY_BATCH in welcome.capabilities
        self.liveness: Optional[float] = None
        self.write_timeout = client.connect_timeout
        if welcome.heartbeat_ms:
            n = welcome.liveness_intervals or _DEFAULT_LIVENESS_INTERVALS
            # One more interval of margin for scheduling and network delay.
            self.liveness = welcome.heartbeat_ms / 1000.0 * (n + 1)
            self.write_timeout = max(self.write_timeout, self.liveness)
        self.drain_timeout = (welcome.ack_timeout_ms / 1000.0) if welcome.ack_timeout_ms else _DEFAULT_DRAIN_TIMEOUT

        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

        self._lock = threading.Lock()  # guards the fields below
        self._woken = False
        # None while acks may be queued; then why they may not.
        self.ended: Optional[BaseException] = None
        self._acks: List[int] = []
        # Nacks by (delay_ms, reason, unprocessed).
        self._nacks: Dict[Tuple[int, str, bool], List[int]] = {}
        # Records (partition, offset) a retiring session gave back: once each.
        self._given_back: Set[Tuple[int, int]] = set()
        self._touches: List[int] = []
        self._pongs: List[int] = []
        # Messages passed on to the client and not yet acked or nacked.
        self.held = 0
        # retire was called: pass nothing more on, say goodbye once held is 0.
        self.draining = False
        self._drain_deadline: Optional[float] = None

        self._closing = False  # Goodbye sent: read until the daemon closes
        self._linger_until = 0.0

    # ------------------------------------------------------------ other threads

    def finish(self, msg: Message, op: int, delay_ms: int = 0, reason: str = "") -> bool:
        """Queues msg's ack (op OP_ACK) or nack; see Message.ack."""
        with self._lock:
            if msg._done:
                raise AlreadyAckedError(f"{msg!r}: already acked or nacked")
            msg._done = True
            if self.ended is not None:
                return False
            self.held -= 1
            if op == OP_ACK:
                self._acks.append(msg.delivery_id)
            else:
                self._nacks.setdefault((delay_ms, reason, False), []).append(msg.delivery_id)
        self.signal()
        return True

    def touch(self, msg: Message) -> bool:
        """Queues msg's touch; see Message.touch."""
        with self._lock:
            if msg._done:
                raise AlreadyAckedError(f"touch of {msg!r}: already acked or nacked")
            if self.ended is not None:
                return False
            self._touches.append(msg.delivery_id)
        self.signal()
        return True

    def release(self, msg: Message) -> None:
        """Counts msg, passed on but dropped before the user took it (its
        session retired or ended), as done, and gives it back (see
        _give_back) while the session can still send: the daemon delivers it
        again at once rather than after its ack timeout or the Goodbye."""
        with self._lock:
            if not msg._done:
                msg._done = True
                self.held -= 1
                self._give_back(msg.delivery_id, msg.partition, msg.offset)
        self.signal()

    def _give_back(self, delivery_id: int, partition: int, offset: int) -> None:
        """Queues a nack of a delivery the session does not pass on (it
        retires: the daemon, which does not know, goes on delivering up to
        its credit). Left in flight, it would wait for the daemon's ack
        timeout or the Goodbye, holding its partition's commit. The nack is
        flagged unprocessed: the daemon does not count it as a failed
        attempt. A record is given back once per session: back again, no
        other client had room, and a nack would bounce it until the session
        ends.
        self._lock is held; an ended session cannot nack (the daemon
        redelivers anyway)."""
        if self.ended is None and (partition, offset) not in self._given_back:
            self._given_back.add((partition, offset))
            self._nacks.setdefault((0, RETIRING_REASON, True), []).append(delivery_id)

    def usable(self) -> bool:
        """Whether a message of this session is worth handing to the user."""
        with self._lock:
            return self.ended is None and not self.draining

    def retire(self, drain_timeout: Optional[float] = None) -> None:
        """Ends the session without losing work and without duplicates: no
        more deliveries are passed on (the daemon delivers them again after
        the Goodbye), and once every message passed on is acked or nacked (or
        the drain timeout, by default the daemon's ack timeout, has passed,
        after which it has redelivered them anyway) the queued acks and a
        Goodbye are sent. It may be called more than once, from any thread."""
        with self._lock:
            if not self.draining:
                self.draining = True
                t = self.drain_timeout if drain_timeout is None else drain_timeout
                self._drain_deadline = time.monotonic() + t
        self.client._drop_queued(self)
        self.signal()

    def retired(self) -> bool:
        with self._lock:
            return self.draining

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
            if self.ended is None:
                self.ended = StaleError(f"session with {self.addr} ended: {err}")
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
                    draining, held, deadline = self.draining, self.held, self._drain_deadline
                if draining and (held <= 0 or (deadline is not None and now >= deadline)):
                    if held > 0:
                        self.log.warning(
                            "retired session: %d messages not acked within %.1fs; they come again", held, deadline
                        )
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
                if self.liveness is not None:
                    timeout = last_read + self.liveness - now
                    if timeout <= 0:
                        raise DaemonSilentError(
                            f"daemon {self.addr} silent for more than {self.liveness:.1f}s"
                        )
                with self._lock:
                    deadline = self._drain_deadline if self.draining else None
                if deadline is not None:
                    timeout = max(0.0, deadline - now) if timeout is None else min(timeout, max(0.0, deadline - now))
            if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
                readable = [self.sock]
            else:
                readable, _, _ = select.select([self.sock, self._wake_r], [], [], timeout)
            if self._wake_r in readable:
                with self._lock:
                    self._woken = False
                try:
                    self._wake_r.recv(4096)
                except BlockingIOError:
                    pass
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
        kind = f.WhichOneof("body")
        if kind == "deliver":
            self._deliver(f.deliver)
        elif kind == "ping":
            with self._lock:
                self._pongs.append(f.ping.nonce)
        elif kind == "pong":
            pass  # any frame is a sign of life
        elif kind == "goodbye":
            # The daemon sends nothing more but takes acks until it closes.
            self.log.info("daemon %s said goodbye: %s", self.addr, f.goodbye.reason)
        elif kind == "error":
            err = RemoteError.from_frame(f.error, self.addr)
            if f.error.fatal:
                raise err
            self.log.warning("daemon reported an error: %s", err)
        elif kind == "redirect":
            raise RedirectError(f.redirect.leader_address)
        elif kind == "members":
            self.client._follow_members(
                self.link, [m.address for m in f.members.members], _wire.members_version(f.members, "version")
            )
        elif kind == "deliver_batch":
            for d in f.deliver_batch.deliveries:
                self._deliver(d)
        elif kind is None:
            self.log.warning("ignoring a frame of a type this client does not know")
        else:
            self.log.warning("ignoring an unexpected %s frame", kind)

    def _deliver(self, d: pb.Deliver) -> None:
        with self._lock:
            if self.draining:
                self._give_back(d.delivery_id, d.partition, d.offset)
                give_back = True
            else:
                self.held += 1
                give_back = False
        if give_back:
            self.signal()
            return
        m = Message(
            d.partition,
            d.offset,
            d.key if d.HasField("key") else None,
            d.value,
            [Header(h.key, h.value) for h in d.headers],
            d.timestamp_ms,
            d.attempt,
            d.delivery_id,
            self,
        )
        self.client._put(m)

    def _take(self) -> Tuple[List[int], Dict[Tuple[int, str, bool], List[int]], List[int], List[int]]:
        with self._lock:
            out = (self._pongs, self._acks, self._nacks, self._touches)
            self._pongs, self._acks, self._nacks, self._touches = [], [], {}, []
        return out[1], out[2], out[3], out[0]

    def _frames(self, acks: List[int], nacks: Dict[Tuple[int, str, bool], List[int]], touches: List[int], pongs: List[int]) -> bytes:
        out = bytearray()
        for nonce in pongs:
            out += _wire.encode(pb.Frame(pong=pb.Pong(nonce=nonce)), self.max_frame)
        for field, ids, delay, reason, unprocessed in (
            [(_wire.FRAME_ACK, acks, 0, "", False)]
            + [(_wire.FRAME_NACK, ids, d, r, u) for (d, r, u), ids in nacks.items()]
            + [(_wire.FRAME_TOUCH, touches, 0, "", False)]
        ):
            for part_ids, part_ranges in _wire.split_ids(ids, self.max_ids, self.ranges):
                body = _wire.ids_frame(field, part_ids, part_ranges, delay, reason, unprocessed)
                out += _wire.prefix(body, self.max_frame)
        return bytes(out)

    def _write(self) -> None:
        data = self._frames(*self._take())
        if data:
            self._send(data)

    def _send(self, data: bytes) -> None:
        self.sock.settimeout(self.write_timeout)
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise ConnectionLostError(f"write to {self.addr}: {e}") from e

    def _goodbye(self, ended: BaseException, reason: str) -> None:
        """Stops the queueing of ids (ack and friends return False from now
        on), sends what was queued and a Goodbye, and lets the loop read
        until the daemon closes (at most LINGER_TIMEOUT)."""
        with self._lock:
            self.ended = ended
        acks, nacks, touches, _ = self._take()
        data = self._frames(acks, nacks, touches, [])
        data += _wire.encode(pb.Frame(goodbye=pb.Goodbye(reason=reason)), self.max_frame)
        self._send(data)
        self._closing = True
        self._linger_until = time.monotonic() + LINGER_TIMEOUT
        if not isinstance(self.sock, ssl.SSLSocket):
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
