"""Python client of fanout, the Kafka-backed work-queue daemon.

::

    import fanout_client

    with fanout_client.connect("localhost:4987") as client:
        for msg in client:
            process(msg.value)
            msg.ack()

See :class:`Client`, :class:`Message` and :meth:`Client.consume`; the
asyncio client is :mod:`fanout_client.aio`; and clients/python/README.md.
"""

import logging

from ._pool import RetryAfter
from .client import Client, connect
from .errors import (
    AlreadyAckedError,
    BadFrameError,
    ClosedError,
    ConnectError,
    ConnectionLostError,
    DaemonSilentError,
    FanoutError,
    FrameTooLargeError,
    HTTPServerError,
    RemoteError,
    SessionClosedError,
)
from .message import BaseMessage, Header, Message

__all__ = [
    "Client",
    "connect",
    "Message",
    "BaseMessage",
    "Header",
    "RetryAfter",
    "FanoutError",
    "ClosedError",
    "AlreadyAckedError",
    "ConnectError",
    "ConnectionLostError",
    "DaemonSilentError",
    "BadFrameError",
    "FrameTooLargeError",
    "HTTPServerError",
    "RemoteError",
    "SessionClosedError",
]

# The package's version, its one place: pyproject.toml reads it (docs/releasing.md).
__version__ = "0.1.0"

# A library logs only where the application configured logging.
logging.getLogger("fanout_client").addHandler(logging.NullHandler())
