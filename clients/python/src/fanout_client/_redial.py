"""Where a link connects next and how long it waits first: the reconnect
rules both clients' links follow (the waiting itself is theirs: a thread's
sleep, a task's)."""

from __future__ import annotations

import random
from typing import Optional, Sequence

from ._options import Options
from ._state import RedirectError
from .errors import is_permanent, retry_after

#: How long a session must last for the reconnect backoff to start over.
STABLE_SESSION = 2.0


def backoff(failures: int, lo: float, hi: float) -> float:
    """The wait before attempt failures+1 after failures failed attempts:
    exponential from lo, capped at hi, the upper half jittered."""
    d = hi
    if failures - 1 < 62:
        d = min(hi, lo * (2 ** max(failures - 1, 0)))
    return d / 2 + random.uniform(0, d / 2)


class Redial:
    """One link's reconnect state: the addresses tried round-robin (a
    preferred one first: the last session's, or the leader a redirect named),
    the failures in a row, whether a daemon ever welcomed it."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self._prefer = ""
        self._next = 0
        self._failures = 0
        self._connected = False

    def target(self, addrs: Sequence[str]) -> str:
        """The address to connect to now."""
        addr, self._prefer = self._prefer, ""
        if not addr:
            addr = addrs[self._next % len(addrs)]
            self._next += 1
        return addr

    def failed(self, err: BaseException, addrs: Sequence[str]) -> Optional[float]:
        """A connection attempt failed with err: the seconds to wait before
        the next, or None to give up (an error reconnecting cannot change,
        or every address tried without reconnect)."""
        self._failures += 1
        if is_permanent(err) or (not self.opts.reconnect and (self._connected or self._failures >= len(addrs))):
            return None
        return retry_after(err) or backoff(self._failures, self.opts.min_backoff, self.opts.max_backoff)

    def welcomed(self) -> None:
        """A daemon welcomed the link."""
        self._connected = True

    def retired(self, addr: str) -> None:
        """The session with addr retired to open again with another credit: at once, to addr."""
        self._prefer, self._failures = addr, 0

    def ended(self, err: BaseException, addr: str, lasted: float, addrs: Sequence[str]) -> Optional[float]:
        """The session with addr ended by err after lasted seconds: the
        seconds to wait before reconnecting, or None to give up."""
        self._prefer = addr
        if retry_after(err) > 0 and len(addrs) > 1:
            self._prefer = ""  # that daemon stopped leading: the next leader is more likely another
        if isinstance(err, RedirectError):
            self._prefer = err.addr
        if is_permanent(err) or not self.opts.reconnect:
            return None
        if lasted >= STABLE_SESSION:
            self._failures = 0
        self._failures += 1
        return retry_after(err) or backoff(self._failures, self.opts.min_backoff, self.opts.max_backoff)
