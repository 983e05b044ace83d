#!/usr/bin/env python3
"""An example nanoservice on fanout, in Python: it counts the words of
documents.

Each message is a JSON document {"id": "...", "text": "..."}. The worker
counts its words and stores the result in a "database", here a directory of
JSON files (--out), one per document id. Storing is idempotent (delivery is
at least once: a document may come twice), and the store may fail for a
while (a "transient" failure, simulated by documents with "flaky": true on
their first attempt): the worker then raises RetryAfter, which nacks the
message with a delay, and the daemon hands it out again later. A document
that is not valid JSON can never succeed: the worker logs it and acks it, so
it does not come back forever (with the daemon's dead-letter topic, raise
instead, and let the daemon move it aside after --max-attempts).

The client's consume runs the handler in a fixed set of worker threads
(--workers): a handler that returns acks its message, one that raises nacks
it.

    pip install ../../clients/python
    python3 worker.py --connect localhost:4987 --out results/

SIGTERM or Ctrl-C stops it cleanly: the messages in hand are finished and
acked, then the client says goodbye.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import threading

import fanout_client

log = logging.getLogger("worker")


class TransientError(Exception):
    """A failure worth retrying later (a database that is briefly away)."""


class ResultStore:
    """The worker's database: one JSON file per document id, written
    atomically, so storing the same result twice is harmless."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)

    def put(self, doc_id: str, result: dict) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(result, f)
        os.replace(tmp, os.path.join(self.path, f"{doc_id}.json"))


def handle(msg: fanout_client.Message, store: ResultStore) -> None:
    """Processes one document. Raises ValueError for a document that can
    never succeed, TransientError for one worth retrying."""
    doc = json.loads(msg.value)  # ValueError when not JSON
    if not isinstance(doc, dict) or not isinstance(doc.get("id"), str) or not isinstance(doc.get("text"), str):
        raise ValueError("want a JSON object with string fields id and text")
    if doc.get("flaky") and msg.attempt == 1:
        raise TransientError("result store unavailable")
    store.put(doc["id"], {"id": doc["id"], "words": len(doc["text"].split()), "attempt": msg.attempt})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="count the words of documents delivered by fanout")
    p.add_argument("--connect", default=os.environ.get("FANOUT_CONNECT", "localhost:4987"),
                   help="comma-separated daemon addresses ($FANOUT_CONNECT)")
    p.add_argument("--auth-token", default=os.environ.get("FANOUT_AUTH_TOKEN", ""))
    p.add_argument("--out", required=True, help="directory of the results (the worker's database)")
    p.add_argument("--retry-delay", type=float, default=1.0, help="seconds before a transient failure is retried")
    p.add_argument("--workers", type=int, default=4, help="documents processed at once")
    p.add_argument("--max-in-flight", type=int, default=16)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    store = ResultStore(args.out)

    def work(msg: fanout_client.Message) -> None:
        """consume's handler: returning acks the message, raising nacks it."""
        try:
            handle(msg, store)
        except TransientError as e:
            log.warning("partition %d offset %d: %s; retrying in %.1fs", msg.partition, msg.offset, e, args.retry_delay)
            raise fanout_client.RetryAfter(args.retry_delay, str(e)) from e
        except ValueError as e:
            log.error("partition %d offset %d: dropping a bad document: %s", msg.partition, msg.offset, e)
            return
        log.info("partition %d offset %d done (attempt %d)", msg.partition, msg.offset, msg.attempt)

    try:
        with fanout_client.connect(args.connect.split(","), auth_token=args.auth_token, client_id="python-worker",
                                   max_in_flight=args.max_in_flight, timeout=60) as client:
            log.info("connected to %s", args.connect)

            def stop(signum, frame):
                # Graceful: no new messages; the ones in hand are finished and acked (within 10 s), then
                # goodbye. close() waits, so it runs beside consume, which returns once the client is closed.
                log.info("stopping")
                threading.Thread(target=client.close, kwargs={"drain": 10.0}, daemon=True).start()

            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)
            client.consume(work, concurrency=args.workers)
    except fanout_client.FanoutError as e:
        log.error("%s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
