"""The settings of a client, checked once: what both clients (threads and
asyncio) are configured with."""

from __future__ import annotations

import logging
import os
import socket
import ssl
from typing import List, Optional, Sequence, Tuple, Union

from . import _wire

#: Defaults of the clients' arguments.
DEFAULT_MAX_IN_FLIGHT = 64
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_MIN_BACKOFF = 0.1
DEFAULT_MAX_BACKOFF = 5.0

# The largest max_in_flight a client asks for.
_MAX_IN_FLIGHT_LIMIT = 1 << 20


class Options:
    """A client's settings, checked (see fanout_client.Client for each)."""

    __slots__ = (
        "addrs", "client_id", "max_in_flight", "auth_token", "ssl_context", "connect_timeout", "reconnect",
        "min_backoff", "max_backoff", "max_frame_size", "batch", "log",
    )

    def __init__(
        self,
        addrs: Union[str, Sequence[str]],
        *,
        client_id: Optional[str],
        max_in_flight: int,
        auth_token: str,
        ssl_context: Optional[ssl.SSLContext],
        connect_timeout: float,
        reconnect: bool,
        min_backoff: float,
        max_backoff: float,
        max_frame_size: int,
        batch: bool,
        logger: Optional[logging.Logger],
    ) -> None:
        self.addrs: List[str] = [addrs] if isinstance(addrs, str) else list(addrs)
        if not self.addrs or any(not a for a in self.addrs):
            raise ValueError("fanout client: no daemon address given")
        for a in self.addrs:
            split_addr(a)
        if not 1 <= max_in_flight <= _MAX_IN_FLIGHT_LIMIT:
            raise ValueError(f"fanout client: max_in_flight {max_in_flight} out of range 1..{_MAX_IN_FLIGHT_LIMIT}")
        if not _wire.MAX_HELLO_SIZE <= max_frame_size <= _wire.MAX_FRAME_SIZE_LIMIT:
            raise ValueError(
                f"fanout client: max_frame_size {max_frame_size} out of range "
                f"{_wire.MAX_HELLO_SIZE}..{_wire.MAX_FRAME_SIZE_LIMIT}"
            )
        if connect_timeout <= 0:
            raise ValueError(f"fanout client: connect_timeout {connect_timeout} must be positive")
        self.client_id: str = client_id or f"{socket.gethostname()}-{os.getpid()}"
        self.max_in_flight = max_in_flight
        self.auth_token = auth_token
        self.ssl_context = ssl_context
        self.connect_timeout = connect_timeout
        self.reconnect = reconnect
        self.min_backoff = max(min_backoff, 0.001)
        self.max_backoff = max(max_backoff, self.min_backoff)
        self.max_frame_size = max_frame_size
        self.batch = batch
        self.log: logging.Logger = logger or logging.getLogger("fanout_client")


def split_addr(addr: str) -> Tuple[str, int]:
    """The host and port of a host:port address (the host without the
    brackets of an IPv6 one); ValueError when it is not one."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"fanout client: address {addr!r} is not host:port")
    return host.strip("[]"), int(port)
