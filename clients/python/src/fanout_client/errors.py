"""Exceptions of the fanout client."""

from __future__ import annotations

from typing import Optional

from ._proto import fanout_pb2 as pb

__all__ = [
    "FanoutError",
    "ClosedError",
    "AlreadyAckedError",
    "RemoteError",
    "FrameTooLargeError",
    "HTTPServerError",
    "BadFrameError",
    "ConnectionLostError",
    "DaemonSilentError",
    "ConnectError",
    "SessionClosedError",
]


class FanoutError(Exception):
    """Base class of every error the client raises."""


class ClosedError(FanoutError):
    """The client was closed (by :meth:`Client.close` or the ``with`` block's end)."""


class AlreadyAckedError(FanoutError):
    """ack(), nack() or touch() on a message that was already acked or nacked."""


class ConnectError(FanoutError):
    """:meth:`Client.connect` found no daemon that welcomed the client in time.

    Its ``__cause__`` is the last connection failure, when there was one.
    """


class SessionClosedError(FanoutError):
    """ack(), nack() or touch() of a message whose session has ended: its
    connection broke, the session retired, or the client was closed. Nothing
    was sent; the daemon delivers the message again (to this client or
    another), so nothing is lost. Its ``__cause__`` says why the session
    ended."""


class ConnectionLostError(FanoutError):
    """A session's connection broke (reset, closed by the daemon, write timeout)."""


class DaemonSilentError(ConnectionLostError):
    """Nothing arrived from the daemon for longer than its heartbeat allows."""


class BadFrameError(FanoutError):
    """A frame from the daemon did not decode as a ``fanout.v1.Frame``."""


class FrameTooLargeError(FanoutError):
    """A frame is larger than the limit in force.

    From the daemon, a frame above the client's ``max_frame_size`` (which the
    client announced in Hello) stops the client: the daemon would send it
    again after a reconnect.
    """

    def __init__(self, size: int, limit: int, direction: str = "from the daemon") -> None:
        super().__init__(f"frame of {size} bytes {direction} is above the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class HTTPServerError(FanoutError):
    """The address answered in HTTP: it is an HTTP server (a daemon's metrics
    and console port, say), not a fanout client port. It stops the client:
    reconnecting would get the same answer."""

    def __init__(self) -> None:
        super().__init__("this is an HTTP server (the metrics and console port?), not a fanout client port")


# The codes worth retrying later or elsewhere (protocol.Temporary in Go).
_TEMPORARY = frozenset(
    {
        pb.ERROR_CODE_NO_LEADER,
        pb.ERROR_CODE_SHUTTING_DOWN,
        pb.ERROR_CODE_TOO_MANY_CLIENTS,
    }
)

# The codes after which reconnecting cannot help: the same request would get
# the same answer.
_PERMANENT = frozenset(
    {
        pb.ERROR_CODE_UNAUTHORIZED,
        pb.ERROR_CODE_UNSUPPORTED_VERSION,
        pb.ERROR_CODE_FRAME_TOO_LARGE,
        pb.ERROR_CODE_TOO_MANY_IDS,
    }
)


class RemoteError(FanoutError):
    """An Error frame from the daemon.

    Attributes:
        code: the ``fanout.v1.ErrorCode`` value (an int; :attr:`code_name` is its name).
        message: the daemon's human-readable detail.
        fatal: whether the daemon closes the connection after it.
        retry_after: for ``ERROR_CODE_NO_LEADER``, seconds to wait before reconnecting (0: none asked).
        addr: the daemon that sent it.
    """

    def __init__(self, code: int, message: str, fatal: bool, retry_after: float, addr: str = "") -> None:
        self.code = code
        self.message = message
        self.fatal = fatal
        self.retry_after = retry_after
        self.addr = addr
        where = f" from {addr}" if addr else ""
        super().__init__(f"daemon error{where}: {self.code_name}: {message}" if message else f"daemon error{where}: {self.code_name}")

    @property
    def code_name(self) -> str:
        """The name of :attr:`code`, e.g. ``ERROR_CODE_NO_LEADER``."""
        try:
            return pb.ErrorCode.Name(self.code)
        except ValueError:
            return f"ERROR_CODE_{self.code}"

    @property
    def temporary(self) -> bool:
        """Whether the code says to retry later or elsewhere (no leader, shutting down, too many clients)."""
        return self.code in _TEMPORARY

    @classmethod
    def from_frame(cls, e: "pb.Error", addr: str = "") -> "RemoteError":
        return cls(e.code, e.message, e.fatal, e.retry_after_ms / 1000.0, addr)


def is_permanent(err: Optional[BaseException]) -> bool:
    """Whether err ends the client instead of a reconnect: a frame above the
    client's limit, an HTTP server's answer, or an Error frame whose cause a
    reconnect would not change (a wrong token, an unsupported version, a
    frame too large or naming too many ids)."""
    if isinstance(err, (FrameTooLargeError, HTTPServerError)):
        return True
    return isinstance(err, RemoteError) and err.code in _PERMANENT


def retry_after(err: Optional[BaseException]) -> float:
    """Seconds the daemon asked to wait before reconnecting, or 0."""
    if isinstance(err, RemoteError):
        return err.retry_after
    return 0.0
