"""The protocol of one connection without its I/O: the Hello a client sends,
what the daemon's answer means, and the state of a welcomed session (the ids
queued for acks, nacks and touches, the messages handed out, retiring).

Both clients drive it: the thread-per-connection client under its session's
lock, the asyncio client from its event loop. Nothing here blocks, sleeps or
touches a socket; a caller feeds it frames and sends the bytes it returns.
"""

from __future__ import annotations

import logging
from typing import Dict, Iterable, List, Optional, Set, Tuple, Union

from . import _wire
from ._options import Options
from ._proto import fanout_pb2 as pb
from .errors import AlreadyAckedError, ConnectionLostError, RemoteError, SessionClosedError
from .message import OP_ACK, BaseMessage

#: How long a session that said goodbye waits for the daemon to close the connection.
LINGER_TIMEOUT = 2.0
#: The reason of the nacks of deliveries a retiring session gives back.
RETIRING_REASON = "client session retiring: not processed"
#: Bounds the Redirect frames followed in one connection attempt.
MAX_REDIRECTS = 5

# Used when a Welcome gives a heartbeat but no liveness_intervals.
_DEFAULT_LIVENESS_INTERVALS = 3
# Bounds a retiring session's wait for its messages when the Welcome gives no ack timeout.
_DEFAULT_DRAIN_TIMEOUT = 30.0

#: The (epoch, generation) of a member list.
Version = Tuple[int, int]
#: A member list a frame carried: its addresses and version (None: none given).
MemberList = Tuple[List[str], Optional[Version]]
#: Where a session logs.
Log = Union[logging.Logger, "logging.LoggerAdapter[logging.Logger]"]
#: Nacks queued, by (delay_ms, reason, unprocessed).
_Nacks = Dict[Tuple[int, str, bool], List[int]]


class StaleError(ConnectionLostError):
    """The session ended; its messages can no longer be acked."""


class RedirectError(ConnectionLostError):
    """The daemon redirected a welcomed session to the leader at addr."""

    def __init__(self, addr: str) -> None:
        super().__init__(f"redirected to {addr}")
        self.addr = addr


# ---------------------------------------------------------------- the handshake


def hello(opts: Options, credit: int) -> bytes:
    """The Hello frame, prefixed, of a session asking for credit messages."""
    caps = [_wire.CAPABILITY_MEMBERS] + ([_wire.CAPABILITY_BATCH] if opts.batch else [])
    frame = pb.Frame(
        hello=pb.Hello(
            client_id=opts.client_id,
            protocol_version=_wire.PROTOCOL_VERSION,
            max_in_flight=credit,
            auth_token=opts.auth_token,
            max_frame_size=opts.max_frame_size,
            capabilities=caps,
        )
    )
    return _wire.encode(frame, _wire.MAX_HELLO_SIZE)


def answer(f: pb.Frame, addr: str) -> Union[pb.Welcome, str, None]:
    """What a frame read before the Welcome means: the Welcome, the leader's
    address for a Redirect, None for a frame to skip (a ping is too early to
    answer). An Error frame is raised as RemoteError, anything else as
    ConnectionError."""
    kind = f.WhichOneof("body")
    if kind == "welcome":
        return f.welcome
    if kind == "redirect":
        if not f.redirect.leader_address:
            raise ConnectionError(f"handshake with {addr}: redirect without a leader address")
        return f.redirect.leader_address
    if kind == "error":
        raise RemoteError.from_frame(f.error, addr)
    if kind in ("ping", "pong"):
        return None
    raise ConnectionError(f"handshake with {addr}: unexpected {kind} frame")


def too_many_redirects(addr: str) -> ConnectionError:
    return ConnectionError(f"more than {MAX_REDIRECTS} redirects, last to {addr}")


def members_of(welcome: pb.Welcome) -> MemberList:
    """The member list of a Welcome."""
    return [m.address for m in welcome.members], _wire.members_version(welcome, "members_version")


# ---------------------------------------------------------------- a welcomed session


class SessionState:
    """One welcomed session's state. Not thread-safe: the caller serializes
    (a lock, or an event loop).

    Acks, nacks and touches queue their delivery ids until ``take`` turns
    everything queued into frames, so that ids queued together go in one
    frame (as ranges of consecutive ids to a daemon that confirmed
    CAPABILITY_BATCH). ``held`` counts the messages passed on and not yet
    acked or nacked; a retiring session (``retire``) passes nothing more on,
    gives back what it does not pass on, and is due to say goodbye once held
    is 0 or its drain deadline has passed (``goodbye_due``).
    """

    def __init__(self, opts: Options, addr: str, welcome: pb.Welcome, credit: int) -> None:
        self.addr = addr
        self.welcome = welcome
        self.credit = credit
        max_frame = welcome.max_frame_size or opts.max_frame_size
        self.max_frame = min(max_frame, opts.max_frame_size)
        self.max_ids = _wire.ids_per_frame(self.max_frame, welcome.max_in_flight)
        # Ranges only to a daemon that confirmed the capability.
        self.ranges = opts.batch and _wire.CAPABILITY_BATCH in welcome.capabilities
        #: Seconds without a frame after which the daemon is taken for dead (None: no heartbeat).
        self.liveness: Optional[float] = None
        #: Bounds a write the daemon does not read.
        self.write_timeout = opts.connect_timeout
        if welcome.heartbeat_ms:
            n = welcome.liveness_intervals or _DEFAULT_LIVENESS_INTERVALS
            # One more interval of margin for scheduling and network delay.
            self.liveness = welcome.heartbeat_ms / 1000.0 * (n + 1)
            self.write_timeout = max(self.write_timeout, self.liveness)
        self.drain_timeout = (welcome.ack_timeout_ms / 1000.0) if welcome.ack_timeout_ms else _DEFAULT_DRAIN_TIMEOUT

        #: None while acks may be queued; then why they may not.
        self.ended: Optional[BaseException] = None
        self._acks: List[int] = []
        self._nacks: _Nacks = {}
        # Records (partition, offset) a retiring session gave back: once each.
        self._given_back: Set[Tuple[int, int]] = set()
        self._touches: List[int] = []
        self._pongs: List[int] = []
        #: Messages passed on and not yet acked or nacked.
        self.held = 0
        #: retire was called: pass nothing more on, say goodbye once held is 0.
        self.draining = False
        #: When a retiring session says goodbye even with messages held (a time.monotonic value).
        self.drain_deadline: Optional[float] = None

    # ------------------------------------------------------------ the application's side

    def check(self) -> None:
        """Raises SessionClosedError when the session takes no more ids."""
        if self.ended is not None:
            raise SessionClosedError(
                f"fanout client: the session with {self.addr} has ended ({self.ended}): "
                "nothing sent, the daemon delivers the message again"
            ) from self.ended

    def finish(self, msg: BaseMessage, op: int, delay_ms: int = 0, reason: str = "") -> None:
        """Queues msg's ack (op OP_ACK) or nack."""
        self.check()
        if msg._done:
            raise AlreadyAckedError(f"{msg!r}: already acked or nacked")
        msg._done = True
        self.held -= 1
        if op == OP_ACK:
            self._acks.append(msg.delivery_id)
        else:
            self._nacks.setdefault((delay_ms, reason, False), []).append(msg.delivery_id)

    def touch(self, msg: BaseMessage) -> None:
        """Queues msg's touch."""
        self.check()
        if msg._done:
            raise AlreadyAckedError(f"touch of {msg!r}: already acked or nacked")
        self._touches.append(msg.delivery_id)

    def release(self, msg: BaseMessage) -> None:
        """Counts msg, passed on but dropped before the user took it (its
        session retired or ended), as done, and gives it back (see
        give_back) while the session can still send: the daemon delivers it
        again at once rather than after its ack timeout or the Goodbye."""
        if not msg._done:
            msg._done = True
            self.held -= 1
            self.give_back(msg.delivery_id, msg.partition, msg.offset)

    def give_back(self, delivery_id: int, partition: int, offset: int) -> None:
        """Queues a nack of a delivery the session does not pass on (it
        retires: the daemon, which does not know, goes on delivering up to
        its credit). Left in flight, it would wait for the daemon's ack
        timeout or the Goodbye, holding its partition's commit. The nack is
        flagged unprocessed: the daemon does not count it as a failed
        attempt. A record is given back once per session: back again, no
        other client had room, and a nack would bounce it until the session
        ends. An ended session cannot nack (the daemon redelivers anyway)."""
        if self.ended is None and (partition, offset) not in self._given_back:
            self._given_back.add((partition, offset))
            self._nacks.setdefault((0, RETIRING_REASON, True), []).append(delivery_id)

    def usable(self) -> bool:
        """Whether a message of this session is worth handing to the user."""
        return self.ended is None and not self.draining

    def retire(self, now: float, drain_timeout: Optional[float] = None) -> bool:
        """Starts retiring (see the class); the goodbye is due at the latest
        drain_timeout (by default the daemon's ack timeout, after which it
        has redelivered the messages anyway) after now. True when it had not
        started yet."""
        if self.draining:
            return False
        self.draining = True
        self.drain_deadline = now + (self.drain_timeout if drain_timeout is None else drain_timeout)
        return True

    def goodbye_due(self, now: float) -> bool:
        """Whether a retiring session should say goodbye now."""
        return self.draining and (self.held <= 0 or (self.drain_deadline is not None and now >= self.drain_deadline))

    # ------------------------------------------------------------ the connection's side

    def handle(self, f: pb.Frame, log: Log) -> Tuple[List[pb.Deliver], Optional[MemberList]]:
        """Applies a frame from the daemon; returns the deliveries to pass on
        (counted as held) and the member list it carries, if any. A pong or
        a give-back may be queued: the caller sends ``take()`` after.

        Raises:
            RemoteError: a fatal Error frame.
            RedirectError: a Redirect frame.
        """
        kind = f.WhichOneof("body")
        if kind == "deliver":
            return self._pass_on([f.deliver]), None
        if kind == "deliver_batch":
            return self._pass_on(f.deliver_batch.deliveries), None
        if kind == "ping":
            self._pongs.append(f.ping.nonce)
        elif kind == "pong":
            pass  # any frame is a sign of life
        elif kind == "goodbye":
            # The daemon sends nothing more but takes acks until it closes.
            log.info("daemon %s said goodbye: %s", self.addr, f.goodbye.reason)
        elif kind == "error":
            err = RemoteError.from_frame(f.error, self.addr)
            if f.error.fatal:
                raise err
            log.warning("daemon reported an error: %s", err)
        elif kind == "redirect":
            raise RedirectError(f.redirect.leader_address)
        elif kind == "members":
            return [], ([m.address for m in f.members.members], _wire.members_version(f.members, "version"))
        elif kind is None:
            log.warning("ignoring a frame of a type this client does not know")
        else:
            log.warning("ignoring an unexpected %s frame", kind)
        return [], None

    def _pass_on(self, ds: Iterable[pb.Deliver]) -> List[pb.Deliver]:
        out: List[pb.Deliver] = []
        for d in ds:
            if self.draining:
                self.give_back(d.delivery_id, d.partition, d.offset)
            else:
                self.held += 1
                out.append(d)
        return out

    def take(self) -> bytes:
        """The frames of everything queued (pongs, acks, nacks, touches),
        prefixed and concatenated; b"" when nothing is."""
        pongs, acks, nacks, touches = self._pongs, self._acks, self._nacks, self._touches
        self._pongs, self._acks, self._nacks, self._touches = [], [], {}, []
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

    def goodbye(self, ended: BaseException, reason: str) -> bytes:
        """Ends the queueing of ids (ack and friends raise SessionClosedError
        from now on) and returns what was queued, then a Goodbye."""
        self._pongs = []
        data = self.take()
        self.ended = ended
        return data + _wire.encode(pb.Frame(goodbye=pb.Goodbye(reason=reason)), self.max_frame)

    def end(self, why: BaseException) -> None:
        """Marks the session ended by why, unless it already is."""
        if self.ended is None:
            self.ended = StaleError(f"session with {self.addr} ended: {why}")
