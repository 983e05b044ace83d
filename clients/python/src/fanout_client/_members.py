"""Following the member list (spread mode): which sessions a client keeps,
with which share of its credit. Pure logic on the links of either client; the
caller serializes (a lock, or an event loop)."""

from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Protocol, Sequence

from ._state import Version


class Link(Protocol):
    """A link as following sees it: one session kept open with a member, or
    with the cluster (member "", following redirects) in leader mode."""

    #: The member it keeps a session with; "" for the cluster link.
    member: str
    #: stop() was called.
    stopping: bool

    def session_addr(self) -> Optional[str]:
        """The address of its current session, None when it has none."""

    def stop(self) -> None:
        """Retires its session and ends the link after it."""

    def set_credit(self, credit: int) -> None:
        """Makes credit its next session's; a session that asked for another
        is retired and opened again with it."""


def share(max_in_flight: int, members: int) -> int:
    """Each member's share of max_in_flight: an even split, at least 1."""
    return max(1, max_in_flight // members) if members > 1 else max_in_flight


class Following:
    """The member list a client follows and its version."""

    def __init__(self, max_in_flight: int, log: logging.Logger) -> None:
        self.max_in_flight = max_in_flight
        self.log = log
        #: The members the client keeps a session with, sorted; empty in leader mode.
        self.members: List[str] = []
        #: The (epoch, generation) of the list followed; None: none.
        self.version: Optional[Version] = None

    def follow(
        self,
        src: Link,
        addrs: Sequence[str],
        version: Optional[Version],
        welcome: bool,
        links: Sequence[Link],
        start: Callable[[str, int], object],
        closing: bool,
    ) -> None:
        """Applies a member list of the given version that src's session
        received (in its Welcome when welcome) to links, calling start(member,
        credit) for each link to open: an empty list means leader mode (src
        becomes the one link, with all the credit); otherwise one link per
        member, each with its share, links of members no longer listed are
        retired, and the cluster link becomes the link of the member it is
        connected to, or retires.

        A list older than the one followed (a lower version, or none in a
        Members frame while the client holds one) is ignored: members may
        disagree for a moment while an assignment spreads. A Welcome without
        a version is leader mode, or an older daemon: followed."""
        if src.stopping:
            return  # its member left: its view is not the one to follow
        new = sorted(set(a for a in addrs if a))
        held = self.version
        if held is not None and ((version is None and not welcome) or (version is not None and version < held)):
            self.log.debug("ignoring member list %s of version %s from %s: following %s", new, version, src.member, held)
            return
        self.version = version
        if new == self.members or closing:
            return
        self.members = new
        if not new:
            self.log.info("no members listed: one session, to the leader")
            src.member = ""
            src.set_credit(self.max_in_flight)
            for link in links:
                if link is not src:
                    link.stop()
            return
        credit = share(self.max_in_flight, len(new))
        self.log.info("members changed: one session per member of %s, max_in_flight %d each", new, credit)
        by_member: Dict[str, Link] = {}
        leaving: List[Link] = []
        clusters: List[Link] = []
        for link in links:
            if link.stopping:
                continue
            if link.member == "":
                clusters.append(link)
            elif link.member in new and link.member not in by_member:
                by_member[link.member] = link
            else:
                leaving.append(link)
        for link in clusters:
            addr = link.session_addr()
            if addr is not None and addr in new and addr not in by_member:
                link.member = addr
                by_member[addr] = link
            else:
                leaving.append(link)
        # Leavers first: a member no longer listed passes nothing more on.
        for link in leaving:
            link.stop()
        for addr in new:
            if addr in by_member:
                by_member[addr].set_credit(credit)
        for addr in new:
            if addr not in by_member:
                start(addr, credit)
