"""The asyncio client against the real daemon, run by integration/python_test.go
(which starts the daemons, produces the messages "m-<i>", kills and restarts
daemons, and checks the committed offsets). Without it the tests fail, never
skip."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import signal

import pytest

import fanout_client
from fanout_client import aio

from test_daemon import TIMEOUT, daemons, env

pytestmark = pytest.mark.integration

FAST = dict(min_backoff=0.05, max_backoff=0.5)


class Events(logging.Handler):
    """Keeps the messages of the client's log records that contain text."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.INFO)
        self.text = text
        self.seen = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if self.text in msg:
            self.seen.append(msg)


def test_worker_outlives_a_kill_9_of_its_daemon():
    """consume with four workers until SIGTERM (sent by the Go test once every
    offset is committed, after it killed the leader with SIGKILL under the
    worker and started it again): every message was handled, the ones in hand
    at the kill (their acks refused: SessionClosedError) again after the
    reconnect."""
    n = int(env("FANOUT_TEST_COUNT"))
    prefix = env("FANOUT_TEST_PREFIX")
    seen: "collections.Counter[str]" = collections.Counter()
    failed_acks = []
    lost = Events("disconnected from")
    logging.getLogger("fanout_client").addHandler(lost)

    async def main():
        async with await aio.connect(daemons(), client_id="py-aio-kill", max_in_flight=16, timeout=TIMEOUT,
                                     **FAST) as c:
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(c.close(drain=10)))

            async def handler(m):
                # Work, slower than the messages come: the workers are busy, and messages in hand, when the
                # daemon dies.
                await asyncio.sleep(0.05)
                seen[m.value.decode()] += 1
                try:
                    await m.ack()
                except fanout_client.SessionClosedError:
                    failed_acks.append(m.value.decode())  # its session died: it comes again

            await c.consume(handler, concurrency=4)

    asyncio.run(main())
    assert lost.seen, "no session of the worker ended: the kill was not under it"
    assert set(seen) == {f"{prefix}-{i}" for i in range(n)}
    assert failed_acks, "no message was in hand at the kill"
    for v in failed_acks:
        assert seen[v] >= 2, f"{v}, in hand at the kill, did not come again"
    redelivered = sum(k - 1 for k in seen.values())
    print(f"handled {len(seen)} messages, {redelivered} again; {len(failed_acks)} acks refused by a dead session;"
          f" sessions lost: {lost.seen}")


def test_spread_one_session_per_member():
    """Given one member's address, the client opens a session with each of the
    members, each with its share of max_in_flight, and receives every message."""
    n = int(env("FANOUT_TEST_COUNT"))
    members = sorted(env("FANOUT_TEST_MEMBERS").split(","))
    acked = {}

    async def main():
        async with await aio.connect(daemons()[0], max_in_flight=9, timeout=TIMEOUT, **FAST) as c:
            loop = asyncio.get_running_loop()
            end = loop.time() + TIMEOUT
            while len(acked) < n:
                left = end - loop.time()
                assert left > 0, f"acked {len(acked)} of {n} messages in {TIMEOUT}s"
                m = await c.get(left)
                if m is None:
                    continue
                assert await m.ack() is True
                acked[m.value.decode()] = m
            assert c.members == members
            credits = sorted(link.credit for link in c._links)
            assert credits == [3, 3, 3], credits

    asyncio.run(main())
    assert sorted(acked) == sorted(f"m-{i}" for i in range(n))
    assert {m.member for m in acked.values()} == set(members)
    for m in acked.values():
        assert m.key is not None and m.value == f"m-{int(m.key)}".encode()


def test_close_drains_the_handlers_in_hand():
    """close(drain) while handlers run: they finish, their acks go out before
    the Goodbye (none refused), and nothing else was handled; the Go test
    checks that exactly the handled prefix is committed."""
    n = int(env("FANOUT_TEST_COUNT"))
    handled = []
    refused = []

    async def main():
        async with await aio.connect(daemons(), max_in_flight=8, timeout=TIMEOUT, **FAST) as c:
            closing = []

            async def handler(m):
                if len(handled) + len(refused) >= 10 and not closing:
                    closing.append(asyncio.ensure_future(c.close(drain=TIMEOUT)))
                await asyncio.sleep(0.2)
                try:
                    await m.ack()
                    handled.append(m.value.decode())
                except fanout_client.SessionClosedError:
                    refused.append(m.value.decode())

            await c.consume(handler, concurrency=4)
            assert closing, "consume returned before the close"
            await closing[0]

    asyncio.run(main())
    assert refused == []
    k = len(handled)
    assert 10 < k < n
    assert sorted(handled) == sorted(f"m-{i}" for i in range(k))  # one partition: the handled prefix
    with open(env("FANOUT_TEST_OUT"), "w") as f:
        json.dump({"handled": k}, f)
