"""One Python fanout client process for bin/bench (fanout-bench starts it with
the interpreter of .cache/python and clients/python/src on PYTHONPATH): it
acks every message it receives, writes "progress N" to standard error every
250 ms and, once standard input closes, closes the client and prints its
result on standard output, the JSON object of the Go workers (Result in
bench/cmd/fanout-bench/worker.go): the messages whose ack was queued, their
value bytes, the first and last ack times.

    python pyclient.py --addr 127.0.0.1:4987 --flavor threads --max-in-flight 1000

--flavor threads uses fanout_client.connect and iterates over the client;
--flavor asyncio uses fanout_client.aio.connect in an event loop. Either
way each message is acked on its own, as an application does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from typing import Dict, List

import fanout_client
from fanout_client import aio


#: How often (in messages) the process's CPU is sampled (cpuSampleEvery of the Go workers).
CPU_SAMPLE_EVERY = 256


class Counter:
    """Counts the acked messages; read by the progress thread. It samples the
    process's CPU once connected (ready) and every CPU_SAMPLE_EVERY messages,
    with the count at the sample."""

    def __init__(self) -> None:
        self.n = 0
        self.bytes = 0
        self.redelivered = 0
        self.errors = 0
        self.first_ns = 0
        self.last_ns = 0
        self.ready_cpu = 0.0
        self.cpu = 0.0
        self.cpu_n = 0

    def ready(self) -> None:
        self.ready_cpu = time.process_time()

    def add(self, value: bytes, attempt: int) -> None:
        now = time.time_ns()
        if self.first_ns == 0:
            self.first_ns = now
        self.last_ns = now
        self.n += 1
        self.bytes += len(value)
        if attempt > 1:
            self.redelivered += 1
        if self.n % CPU_SAMPLE_EVERY == 0:
            self.cpu, self.cpu_n = time.process_time(), self.n

    def result(self) -> Dict[str, object]:
        if self.cpu_n == 0:
            self.cpu, self.cpu_n = time.process_time(), self.n
        return {"messages": self.n, "bytes": self.bytes, "redelivered": self.redelivered,
                "first_ns": self.first_ns, "last_ns": self.last_ns, "errors": self.errors,
                "ready_cpu_s": self.ready_cpu, "cpu_s": self.cpu, "cpu_messages": self.cpu_n}


def report_progress(c: Counter, stop: threading.Event) -> None:
    while not stop.wait(0.25):
        print(f"progress {c.n}", file=sys.stderr, flush=True)


def wait_stdin() -> None:
    """Returns once standard input closes: the driver's signal to stop."""
    while os.read(0, 65536):
        pass


def run_threads(addr: str, max_in_flight: int, c: Counter) -> None:
    client = fanout_client.connect(addr, max_in_flight=max_in_flight, client_id=f"bench-py-{os.getpid()}")
    c.ready()

    def closer() -> None:
        wait_stdin()
        client.close()

    threading.Thread(target=closer, daemon=True).start()
    for m in client:
        try:
            m.ack()
        except fanout_client.FanoutError:
            c.errors += 1
            continue
        c.add(m.value, m.attempt)


def run_asyncio(addr: str, max_in_flight: int, c: Counter) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        client = await aio.connect(addr, max_in_flight=max_in_flight, client_id=f"bench-py-{os.getpid()}")
        c.ready()
        stdin_closed = loop.run_in_executor(None, wait_stdin)
        closing: List["asyncio.Future[None]"] = []

        def close(_: object) -> None:
            closing.append(asyncio.ensure_future(client.close()))

        stdin_closed.add_done_callback(close)
        async for m in client:
            try:
                await m.ack()
            except fanout_client.FanoutError:
                c.errors += 1
                continue
            c.add(m.value, m.attempt)
        await asyncio.gather(*closing)

    asyncio.run(main())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", default="127.0.0.1:4987")
    p.add_argument("--flavor", choices=["threads", "asyncio"], default="threads")
    p.add_argument("--max-in-flight", type=int, default=1000)
    args = p.parse_args()
    c = Counter()
    stop = threading.Event()
    threading.Thread(target=report_progress, args=(c, stop), daemon=True).start()
    if args.flavor == "threads":
        run_threads(args.addr, args.max_in_flight, c)
    else:
        run_asyncio(args.addr, args.max_in_flight, c)
    stop.set()
    print(json.dumps(c.result()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
