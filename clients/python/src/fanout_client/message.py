"""Messages delivered by a fanout daemon."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, List, NamedTuple, Optional

from ._wire import MAX_NACK_DELAY_MS
from .errors import AlreadyAckedError

if TYPE_CHECKING:  # pragma: no cover
    from ._session import Session

__all__ = ["Header", "Message"]

# What a session queues for its writer.
OP_ACK, OP_NACK, OP_TOUCH = 0, 1, 2


class Header(NamedTuple):
    """One Kafka record header."""

    key: str
    value: bytes


class Message:
    """One delivery of a Kafka record.

    Ack it once processed; without an ack within the daemon's ack timeout, or
    when its connection breaks first, the daemon delivers it again (possibly
    to another client). ``ack``, ``nack`` and ``touch`` may be called from any
    thread; they queue the delivery id for the session's writer, which sends
    the ids queued by then in one frame. Delivery is at least once: a message
    may come twice, so process idempotently (``partition`` and ``offset``
    identify the record).

    Attributes:
        partition: the Kafka partition.
        offset: the offset within the partition.
        key: the record key (``b""`` when it has none).
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
        key: bytes,
        value: bytes,
        headers: List[Header],
        timestamp_ms: int,
        attempt: int,
        delivery_id: int,
        session: "Optional[Session]" = None,
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
        """Whether ack() or nack() was called."""
        return self._done

    def ack(self) -> bool:
        """Tells the daemon the message is processed.

        Returns True once the ack is queued for sending (an ack queued just
        before the connection breaks may still be lost: the message then comes
        again), False when it cannot be sent: the message's connection has
        ended or the client was closed, and the daemon will deliver it again.

        Raises:
            AlreadyAckedError: after a previous ack() or nack().
        """
        return self._finish(OP_ACK)

    def nack(self, delay: Optional[float] = None, reason: str = "") -> bool:
        """Gives the message back to the daemon for redelivery, to another
        client where one has room. Returns and raises like ack().

        Args:
            delay: seconds before the daemon redelivers it (at most 15
                minutes; None or 0: at once, or after the daemon's
                --retry-backoff). A daemon without nack delays (an older
                version) ignores it and redelivers at once.
            reason: why, for the daemon's logs and the dead-letter record
                (the daemon keeps 256 bytes of it).
        """
        delay_ms = 0
        if delay is not None:
            if delay < 0:
                raise ValueError(f"nack delay {delay!r} is negative")
            delay_ms = min(int(round(delay * 1000)), MAX_NACK_DELAY_MS)
        return self._finish(OP_NACK, delay_ms, reason)

    def touch(self) -> bool:
        """Restarts the message's ack timeout on the daemon, for work that
        takes longer than it. Returns like ack().

        Raises:
            AlreadyAckedError: after ack() or nack().
        """
        if self._session is None:
            if self._done:
                raise AlreadyAckedError(f"touch of {self!r}: already acked or nacked")
            return False
        return self._session.touch(self)

    def _finish(self, op: int, delay_ms: int = 0, reason: str = "") -> bool:
        s = self._session
        if s is None:
            if self._done:
                raise AlreadyAckedError(f"{self!r}: already acked or nacked")
            self._done = True
            return False
        return s.finish(self, op, delay_ms, reason)

    def __repr__(self) -> str:
        return f"<fanout Message partition={self.partition} offset={self.offset} attempt={self.attempt} delivery_id={self.delivery_id}>"
