"""consume: a handler run on a client's messages by a fixed set of workers,
each message acked or nacked by the handler's outcome. What both clients'
consume share: RetryAfter and the rule from an outcome to an ack or a nack."""

from __future__ import annotations

import logging
from typing import Optional

from .errors import AlreadyAckedError, SessionClosedError
from .message import OP_ACK, OP_NACK, BaseMessage

__all__ = ["RetryAfter"]

# The daemon keeps 256 bytes of a nack's reason; a longer one is cut there.
_MAX_REASON = 256


class RetryAfter(Exception):
    """Raised by a consume handler for a failure that may pass (a dependency
    that is down, say): the message is nacked with ``delay``, and the daemon
    delivers it again no earlier than delay seconds from now (at most 15
    minutes), to this client or another. For a message that can never
    succeed raise any other exception: it is nacked without a delay, and the
    daemon's --retry-backoff and --max-attempts apply.

    ::

        raise fanout_client.RetryAfter(5.0, "search index: 503")
        raise fanout_client.RetryAfter(5.0) from err   # the reason is err's text

    Attributes:
        delay: seconds before the daemon delivers the message again.
        reason: the nack's reason (default: the text of ``__cause__``).
    """

    def __init__(self, delay: float, reason: str = "") -> None:
        if delay < 0:
            raise ValueError(f"RetryAfter delay {delay!r} is negative")
        super().__init__(delay, reason)
        self.delay = delay
        self.reason = reason

    def __str__(self) -> str:
        if self.reason:
            return self.reason
        if self.__cause__ is not None:
            return _text(self.__cause__)
        return f"retry after {self.delay:g}s"


def _text(err: BaseException) -> str:
    """An exception as a nack's reason: its type and text."""
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def settle(msg: BaseMessage, err: Optional[BaseException], log: logging.Logger) -> None:
    """Acks msg after its handler returned (err None), or nacks it after the
    handler raised err: with RetryAfter's delay, or none (the daemon's
    --retry-backoff applies), err's text the reason. Nothing more when the
    handler acked or nacked msg itself; an ack or a nack that cannot be sent
    (the message's session ended: it comes again) is logged."""
    if msg.acked:
        return
    try:
        if err is None:
            msg._finish(OP_ACK)
            return
        delay: Optional[float] = None
        if isinstance(err, RetryAfter):
            delay, reason = err.delay, str(err)
            log.debug("handler asked for a retry in %gs: nacking partition %d offset %d (attempt %d): %s",
                      err.delay, msg.partition, msg.offset, msg.attempt, reason)
        else:
            reason = _text(err)
            log.warning("handler failed: nacking partition %d offset %d (attempt %d)",
                        msg.partition, msg.offset, msg.attempt, exc_info=err)
        msg._finish(OP_NACK, delay, reason.encode("utf-8")[:_MAX_REASON].decode("utf-8", "ignore"))
    except SessionClosedError as e:
        log.debug("ack or nack of partition %d offset %d not sent: the message comes again: %s",
                  msg.partition, msg.offset, e)
    except AlreadyAckedError:
        pass  # the handler settled it meanwhile, from another thread


def check_concurrency(concurrency: int) -> None:
    if concurrency < 1:
        raise ValueError(f"fanout client: consume with concurrency {concurrency}: at least 1")
