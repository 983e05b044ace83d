#!/usr/bin/env python3
"""A chaos client process on the Python client (clients/python): acks every
message after a random processing time (nacks a poison one at once), and
logs one event line per delivery, ack and nack in the format of
chaos/events.go, each with one write(2) before it acts, like the
Go chaos client.

    PYTHONPATH=clients/python/src python3 pyclient.py --addrs A,B --name py0.1 --log py0.log --seed 1
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time

import fanout_client

POISON_PREFIX = b"poison-"  # chaos.PoisonPrefix: every client nacks it


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addrs", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-in-flight", type=int, default=16)
    p.add_argument("--max-process", type=float, default=0.02, help="processing time is uniform below this (s)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    rng = random.Random(args.seed)
    fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    idx = 0

    def write(kind: str, i: int, m: fanout_client.Message) -> None:
        line = f"{time.time_ns()} {kind} {args.name} {i} {m.partition} {m.offset} {m.attempt} {m.member or '-'} {m.delivery_id} "
        os.write(fd, line.encode() + m.value + b"\n")

    try:
        client = fanout_client.connect(args.addrs.split(","), timeout=None, max_in_flight=args.max_in_flight,
                                       client_id=args.name)
        with client:
            for m in client:
                idx += 1
                write("D", idx, m)
                if m.value.startswith(POISON_PREFIX):
                    write("N", idx, m)
                    m.nack()
                    continue
                time.sleep(rng.uniform(0, args.max_process))
                write("A", idx, m)
                m.ack()
    except KeyboardInterrupt:
        pass
    except fanout_client.FanoutError as e:
        print(f"pyclient: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
