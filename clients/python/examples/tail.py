#!/usr/bin/env python3
"""Prints the messages of a fanout daemon and acks them, like `fanout tail`.

    python3 tail.py --connect localhost:4987 --json --count 10

Each message is acked once printed and flushed. In spread mode one address
is enough: the client opens a session with every member.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import ssl
import sys

import fanout_client


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connect", default=os.environ.get("FANOUT_CONNECT", "localhost:4987"),
                   help="comma-separated daemon addresses host:port ($FANOUT_CONNECT)")
    p.add_argument("--count", type=int, default=0, help="exit after N messages (0: until interrupted)")
    p.add_argument("--json", action="store_true", help="print one JSON object per message")
    p.add_argument("--no-ack", action="store_true", help="do not ack (the daemon redelivers after its ack timeout)")
    p.add_argument("--max-in-flight", type=int, default=64, help="unacked messages held at once")
    p.add_argument("--auth-token", default=os.environ.get("FANOUT_AUTH_TOKEN", ""), help="the daemon's shared secret")
    p.add_argument("--tls-ca", help="connect with TLS, trusting this CA file")
    p.add_argument("--timeout", type=float, default=10.0, help="give up when no daemon welcomes within this (s)")
    args = p.parse_args(argv)
    if args.count < 0:
        p.error("--count must not be negative")

    # SIGTERM ends the loop like Ctrl-C: the client then says goodbye.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    ctx = ssl.create_default_context(cafile=args.tls_ca) if args.tls_ca else None
    try:
        client = fanout_client.connect(args.connect.split(","), timeout=args.timeout, max_in_flight=args.max_in_flight,
                                       auth_token=args.auth_token, ssl_context=ctx)
    except fanout_client.ConnectError as e:
        print(f"tail: {e}", file=sys.stderr)
        return 1
    printed = 0
    try:
        with client:
            for msg in client:
                print(render(msg) if args.json else msg.value.decode("utf-8", "replace"), flush=True)
                if not args.no_ack:
                    try:
                        msg.ack()
                    except fanout_client.SessionClosedError:
                        pass  # its connection ended: the daemon delivers it again
                printed += 1
                if args.count and printed >= args.count:
                    break
    except KeyboardInterrupt:
        pass
    except fanout_client.FanoutError as e:
        print(f"tail: {e}", file=sys.stderr)
        return 1
    return 0


def render(msg: fanout_client.Message) -> str:
    def text(b: bytes):
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(b).decode()}

    return json.dumps({
        "partition": msg.partition,
        "offset": msg.offset,
        "key": None if msg.key is None else text(msg.key),
        "value": text(msg.value),
        "timestamp": msg.timestamp.isoformat(),
        "attempt": msg.attempt,
        "headers": [{"key": h.key, "value": text(h.value)} for h in msg.headers],
    })


if __name__ == "__main__":
    sys.exit(main())
