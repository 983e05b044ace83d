#!/usr/bin/env python3
"""Messages per second through each way of consuming, both clients: a fake
daemon in another process (its own interpreter, so that it does not share
the clients' GIL) keeps the client's credit full with DeliverBatch frames of
100-byte messages and counts the acks; each run times n messages from the
first delivery to the last ack.

    cd clients/python && PYTHONPATH=src ../../.cache/python/bin/python tests/bench_clients.py --count 20000

The loop variants are the old API's too (``for m in client: m.ack()``), so
the script runs against an older checkout of the package for a comparison
(``--only threads-loop``).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import sys
import time
from typing import Callable, Dict

import fanout_client
from fanout_client import _wire
from fanout_client._proto import fanout_pb2 as pb

_BATCH = 64


def serve(lsock: socket.socket, n: int, results: "multiprocessing.Queue[float]") -> None:
    """The fake daemon: one connection, n messages, then the elapsed seconds on results."""
    conn, _ = lsock.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = _wire.FrameReader(_wire.MAX_FRAME_SIZE_LIMIT)
    frames = []
    while not frames:
        frames = reader.feed(conn.recv(65536))
    hello = frames.pop(0).hello
    credit = hello.max_in_flight
    welcome = pb.Welcome(protocol_version=1, max_in_flight=credit, heartbeat_ms=60_000, ack_timeout_ms=60_000,
                         node_id="bench", capabilities=[pb.CAPABILITY_BATCH])
    conn.sendall(_wire.encode(pb.Frame(welcome=welcome), _wire.MAX_FRAME_SIZE_LIMIT))
    value = b"x" * 100
    sent = acked = inflight = 0
    start = time.monotonic()
    while acked < n:
        room = min(credit - inflight, n - sent)
        out = bytearray()
        while room > 0:
            k = min(room, _BATCH)
            batch = pb.DeliverBatch(deliveries=[
                pb.Deliver(delivery_id=sent + i + 1, partition=0, offset=sent + i, value=value, attempt=1)
                for i in range(k)])
            out += _wire.encode(pb.Frame(deliver_batch=batch), _wire.MAX_FRAME_SIZE_LIMIT)
            sent, inflight, room = sent + k, inflight + k, room - k
        if out:
            conn.sendall(out)
        for f in reader.feed(conn.recv(1 << 20)):
            a = f.ack if f.HasField("ack") else None
            if a is None:
                continue
            k = len(a.delivery_ids) + sum(a.ranges[i + 1] for i in range(0, len(a.ranges), 2))
            acked, inflight = acked + k, inflight - k
    results.put(time.monotonic() - start)
    conn.close()


def threads_loop(addr: str, n: int, max_in_flight: int) -> None:
    with fanout_client.connect(addr, max_in_flight=max_in_flight) as c:
        got = 0
        for m in c:
            m.ack()
            got += 1
            if got == n:
                break


def threads_consume(addr: str, n: int, max_in_flight: int) -> None:
    c = fanout_client.connect(addr, max_in_flight=max_in_flight)
    import threading

    lock = threading.Lock()
    got = [0]

    def handle(m: fanout_client.Message) -> None:
        with lock:
            got[0] += 1
            if got[0] == n:
                threading.Thread(target=c.close, kwargs={"drain": 10}).start()

    c.consume(handle, concurrency=4)


def aio_loop(addr: str, n: int, max_in_flight: int) -> None:
    from fanout_client import aio

    async def main() -> None:
        async with await aio.connect(addr, max_in_flight=max_in_flight) as c:
            got = 0
            async for m in c:
                await m.ack()
                got += 1
                if got == n:
                    break

    asyncio.run(main())


def aio_consume(addr: str, n: int, max_in_flight: int) -> None:
    from fanout_client import aio

    async def main() -> None:
        c = await aio.connect(addr, max_in_flight=max_in_flight)
        got = [0]
        closing = []

        async def handle(m: aio.Message) -> None:
            got[0] += 1
            if got[0] == n:
                closing.append(asyncio.ensure_future(c.close(drain=10)))

        await c.consume(handle, concurrency=4)
        await asyncio.gather(*closing)

    asyncio.run(main())


VARIANTS: Dict[str, Callable[[str, int, int], None]] = {
    "threads-loop": threads_loop,
    "threads-consume": threads_consume,
    "asyncio-loop": aio_loop,
    "asyncio-consume": aio_consume,
}


def run(name: str, n: int, max_in_flight: int) -> float:
    """Messages per second of variant name over n messages."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    addr = "127.0.0.1:%d" % lsock.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    results: "multiprocessing.Queue[float]" = ctx.Queue()
    daemon = ctx.Process(target=serve, args=(lsock, n, results), daemon=True)
    daemon.start()
    lsock.close()
    VARIANTS[name](addr, n, max_in_flight)
    elapsed = results.get(timeout=600)
    daemon.join(60)
    return n / elapsed


def main(argv: "list[str] | None" = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=20000, help="messages per run")
    p.add_argument("--max-in-flight", type=int, default=256)
    p.add_argument("--only", action="append", choices=sorted(VARIANTS), help="run only these variants")
    args = p.parse_args(argv)
    for name in args.only or list(VARIANTS):
        if name not in VARIANTS:
            continue
        rate = run(name, args.count, args.max_in_flight)
        print(f"{name:16} {rate:10.0f} msg/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
