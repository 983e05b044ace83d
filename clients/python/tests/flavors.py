"""Both clients behind one blocking interface, so that one test checks the
threaded client and the asyncio client alike: the asyncio client runs in an
event loop of its own thread, and its proxies wait for each call's
coroutine there."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Iterator, Optional

import fanout_client
from fanout_client import aio

from fake import TIMEOUT


class Loop:
    """An event loop in a thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: Optional[float] = TIMEOUT) -> Any:
        """Runs coro in the loop and returns its result (raises its exception)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Calls fn in the loop's thread and returns its result."""

        async def call() -> Any:
            return fn()

        return self.run(call())

    def close(self) -> None:
        async def rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()


class AioMessage:
    """An aio.Message whose ack, nack and touch block until done."""

    def __init__(self, loop: Loop, m: aio.Message) -> None:
        self._loop = loop
        self.message = m

    def __getattr__(self, name: str) -> Any:
        return getattr(self.message, name)

    def ack(self) -> bool:
        return self._loop.run(self.message.ack())

    def nack(self, delay: Optional[float] = None, reason: str = "") -> bool:
        return self._loop.run(self.message.nack(delay, reason))

    def touch(self) -> bool:
        return self._loop.run(self.message.touch())


class AioClient:
    """An aio.Client with the threaded client's blocking methods."""

    def __init__(self, loop: Loop, c: aio.Client) -> None:
        self._loop = loop
        self.client = c

    def get(self, timeout: Optional[float] = None) -> Optional[AioMessage]:
        m = self._loop.run(self.client.get(timeout), None)
        return None if m is None else AioMessage(self._loop, m)

    def __iter__(self) -> Iterator[AioMessage]:
        while True:
            try:
                m = self._loop.run(self.client.__anext__(), None)
            except StopAsyncIteration:
                return
            yield AioMessage(self._loop, m)

    def close(self, drain: float = 0.0) -> None:
        self._loop.run(self.client.close(drain), None)

    def __enter__(self) -> "AioClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def error(self) -> Optional[BaseException]:
        return self._loop.call(lambda: self.client.error)

    @property
    def members(self) -> list:
        return self._loop.call(lambda: self.client.members)


class Flavor:
    """How a test makes a client: name is "threads" or "asyncio"."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop: Optional[Loop] = Loop() if name == "asyncio" else None

    def connect(self, addrs: Any, **kw: Any) -> Any:
        """A connected client of this flavor (fanout_client.connect's arguments)."""
        if self.loop is None:
            return fanout_client.connect(addrs, **kw)
        return AioClient(self.loop, self.loop.run(aio.connect(addrs, **kw), None))

    def consume_bg(self, client: Any, behavior: Callable[[Any], None], concurrency: int) -> Any:
        """Runs client.consume in a thread, its handler calling behavior(msg)
        (blocking; for the asyncio client in the loop's executor, msg an
        AioMessage); returns the thread and a holder of what consume raised."""
        out: dict = {}
        if self.loop is None:
            run = lambda: client.consume(behavior, concurrency=concurrency)  # noqa: E731
        else:
            loop = self.loop

            async def handler(m: aio.Message) -> None:
                await asyncio.get_running_loop().run_in_executor(None, behavior, AioMessage(loop, m))

            run = lambda: loop.run(client.client.consume(handler, concurrency=concurrency), None)  # noqa: E731

        def target() -> None:
            try:
                run()
            except BaseException as e:  # noqa: BLE001
                out["error"] = e

        t = threading.Thread(target=target, daemon=True)
        t.start()
        return t, out

    def close(self) -> None:
        if self.loop is not None:
            self.loop.close()


FAST = dict(min_backoff=0.01, max_backoff=0.05, connect_timeout=5.0)

#: The threaded client, for the tests of it alone.
THREADS = Flavor("threads")


def connect_bg(flavor, addrs, **kw):
    """Connects a client of flavor in a thread (the fake daemon answers in the test's); returns a result holder
    and the thread."""
    out = {}

    def run():
        try:
            out["client"] = flavor.connect(addrs, timeout=TIMEOUT, **{**FAST, **kw})
        except Exception as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return out, t


def open_session(flavor, daemon, **kw):
    """A client of flavor welcomed by daemon; returns (client, conn, hello)."""
    welcome = kw.pop("welcome", {})
    out, t = connect_bg(flavor, daemon.addr, **kw)
    conn = daemon.accept()
    hello = conn.welcome(**welcome)
    t.join(TIMEOUT)
    assert "client" in out, out.get("error")
    return out["client"], conn, hello
