"""Python client of fanout, the Kafka-backed work-queue daemon.

::

    import fanout_client

    with fanout_client.connect("localhost:4987") as client:
        for msg in client:
            process(msg.value)
            msg.ack()

See :class:`Client` and :class:`Message`, and clients/python/README.md.
"""

import logging

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
    RemoteError,
)
from .message import Header, Message

__all__ = [
    "Client",
    "connect",
    "Message",
    "Header",
    "FanoutError",
    "ClosedError",
    "AlreadyAckedError",
    "ConnectError",
    "ConnectionLostError",
    "DaemonSilentError",
    "BadFrameError",
    "FrameTooLargeError",
    "RemoteError",
]

# The package's version, its one place: pyproject.toml reads it (docs/releasing.md).
__version__ = "0.1.0"

# A library logs only where the application configured logging.
logging.getLogger("fanout_client").addHandler(logging.NullHandler())
