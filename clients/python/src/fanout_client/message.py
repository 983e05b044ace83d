"""Messages delivered by a fanout daemon."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, List, NamedTuple, Optional, Type, TypeVar

from ._wire import MAX_NACK_DELAY_MS
from .errors import SessionClosedError

if TYPE_CHECKING:  # pragma: no cover
    from typing import Protocol

    from ._proto import fanout_pb2 as pb

    class _Settler(Protocol):
        """What a message's session does for it (both clients' sessions)."""

        addr: str

        def finish(self, msg: "BaseMessage", op: int, delay_ms: int, reason: str) -> None: ...

        def touch(self, msg: "BaseMessage") -> None: ...

__all__ = ["Header", "Message", "BaseMessage"]

# What a session queues for its writer.
OP_ACK, OP_NACK, OP_TOUCH = 0, 1, 2


_M = TypeVar("_M", bound="BaseMessage")


class Header(NamedTuple):
    """One Kafka record header."""

    key: str
    value: bytes


class BaseMessage:
    """One delivery of a Kafka record: what both clients' messages share (the
    record, the delivery, the session it came on). See :class:`Message`.

    Attributes:
        partition: the Kafka partition.
        offset: the offset within the partition.
        key: the record key: ``None`` when the record has none (Kafka's null
            key), ``b""`` when its key is empty. (A daemon older than this
            distinction sends an empty key as none.)
        value: the record value.
        headers: the record headers, in order.
        timestamp_ms: the record timestamp, milliseconds since the Unix epoch.
        attempt: 1 for the first delivery by this daemon, then 2, 3, ...
        delivery_id: names this delivery (this attempt) to the daemon that made it.
    """

    __slots__ = ("partition", "offset", "key", "value", "headers", "timestamp_ms", "attempt", "delivery_id", "_session", "_done")

    def __init__(
        self,
        partition: int,
        offset: int,
        key: Optional[bytes],
        value: bytes,
        headers: List[Header],
        timestamp_ms: int,
        attempt: int,
        delivery_id: int,
        session: "Optional[_Settler]" = None,
    ) -> None:
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.headers = headers
        self.timestamp_ms = timestamp_ms
        self.attempt = attempt
        self.delivery_id = delivery_id
        self._session = session
        self._done = False

    @classmethod
    def _of(cls: Type[_M], d: "pb.Deliver", session: "_Settler") -> _M:
        """The message of a Deliver that session received."""
        return cls(
            d.partition,
            d.offset,
            d.key if d.HasField("key") else None,
            d.value,
            [Header(h.key, h.value) for h in d.headers],
            d.timestamp_ms,
            d.attempt,
            d.delivery_id,
            session,
        )

    @property
    def timestamp(self) -> datetime.datetime:
        """The record timestamp as an aware UTC datetime."""
        return datetime.datetime.fromtimestamp(self.timestamp_ms / 1000.0, tz=datetime.timezone.utc)

    @property
    def member(self) -> str:
        """The address (host:port) of the daemon whose session delivered the
        message: in spread mode the member owning its partition, in leader
        mode the leader."""
        return self._session.addr if self._session is not None else ""

    @property
    def acked(self) -> bool:
        """Whether ack() or nack() was called (and the id queued)."""
        return self._done

    def _finish(self, op: int, delay: Optional[float] = None, reason: str = "") -> bool:
        delay_ms = 0
        if delay is not None:
            if delay < 0:
                raise ValueError(f"nack delay {delay!r} is negative")
            delay_ms = min(int(round(delay * 1000)), MAX_NACK_DELAY_MS)
        s = self._session
        if s is None:
            raise SessionClosedError(f"{self!r} came on no session: nothing to ack it on")
        s.finish(self, op, delay_ms, reason)
        return True

    def _touch(self) -> bool:
        s = self._session
        if s is None:
            raise SessionClosedError(f"{self!r} came on no session: nothing to touch it on")
        s.touch(self)
        return True

    def __repr__(self) -> str:
        return f"<fanout Message partition={self.partition} offset={self.offset} attempt={self.attempt} delivery_id={self.delivery_id}>"


class Message(BaseMessage):
    """One delivery of a Kafka record, from :class:`fanout_client.Client`.

    Ack it once processed; without an ack within the daemon's ack timeout, or
    when its connection breaks first, the daemon delivers it again (possibly
    to another client). ``ack``, ``nack`` and ``touch`` may be called from any
    thread; they queue the delivery id for the session's thread, which sends
    the ids queued by then in one frame. Delivery is at least once: a message
    may come twice, so process idempotently (``partition`` and ``offset``
    identify the record). The attributes are :class:`BaseMessage`'s.
    """

    __slots__ = ()

    def ack(self) -> bool:
        """Tells the daemon the message is processed.

        Returns True once the ack is queued for sending (an ack queued just
        before the connection breaks may still be lost: the message then
        comes again).

        Raises:
            SessionClosedError: the message's session has ended (its
                connection broke, it retired, or the client was closed):
                nothing is sent, and the daemon delivers the message again.
            AlreadyAckedError: after a previous ack() or nack().
        """
        return self._finish(OP_ACK)

    def nack(self, delay: Optional[float] = None, reason: str = "") -> bool:
        """Gives the message back to the daemon for redelivery, to another
        client where one has room. Returns and raises like ack().

        Args:
            delay: seconds before the daemon redelivers it (at most 15
                minutes; None or 0: after the daemon's --retry-backoff, by
                default 1 s doubling with each failure of the message, at
                most 1 min; the client adds no delay of its own). A daemon
                without nack delays (an older version) ignores it.
            reason: why, for the daemon's logs and the dead-letter record
                (the daemon keeps 256 bytes of it).
        """
        return self._finish(OP_NACK, delay, reason)

    def touch(self) -> bool:
        """Restarts the message's ack timeout on the daemon, for work that
        takes longer than it. Returns and raises like ack() (AlreadyAckedError
        after ack() or nack())."""
        return self._touch()
