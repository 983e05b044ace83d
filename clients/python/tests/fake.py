"""An in-process fake daemon for the client's unit tests: it speaks raw
frames on 127.0.0.1:0, one accepted connection at a time handed to the test."""

from __future__ import annotations

import queue
import socket
import struct
import threading
from typing import List, Optional, Tuple

from fanout_client import _wire
from fanout_client._proto import fanout_pb2 as pb

TIMEOUT = 20.0  # generous: a loaded 2-core machine


class Conn:
    """One connection accepted by the fake daemon."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(TIMEOUT)
        self.reader = _wire.FrameReader(_wire.MAX_FRAME_SIZE_LIMIT)
        self.frames: List[Tuple[pb.Frame, bytes]] = []

    def send(self, frame: pb.Frame) -> None:
        self.send_raw(_wire.encode(frame, _wire.MAX_FRAME_SIZE_LIMIT))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next(self, timeout: float = TIMEOUT) -> Tuple[pb.Frame, bytes]:
        """The next frame from the client (and its body); AssertionError at EOF."""
        self.sock.settimeout(timeout)
        while not self.frames:
            data = self.sock.recv(65536)
            assert data, "client closed the connection"
            self.frames = [(_wire.decode(b), b) for b in self.reader.feed_bodies(data)]
        return self.frames.pop(0)

    def expect(self, kind: str, timeout: float = TIMEOUT, skip=("pong",)) -> pb.Frame:
        """The next frame of kind, skipping kinds in skip."""
        while True:
            f, _ = self.next(timeout)
            k = f.WhichOneof("body")
            if k == kind:
                return f
            assert k in skip, f"got a {k} frame, want {kind}: {f}"

    def expect_any(self, kinds, timeout: float = TIMEOUT, skip=("pong",)) -> pb.Frame:
        """The next frame of one of kinds, skipping kinds in skip."""
        while True:
            f, _ = self.next(timeout)
            k = f.WhichOneof("body")
            if k in kinds:
                return f
            assert k in skip, f"got a {k} frame, want one of {kinds}: {f}"

    def expect_body(self, kind: str) -> bytes:
        while True:
            f, body = self.next()
            if f.WhichOneof("body") == kind:
                return body

    def welcome(self, **kw) -> pb.Hello:
        """Reads the Hello and answers with a Welcome of kw (defaults: a long heartbeat)."""
        hello = self.expect("hello").hello
        kw.setdefault("max_in_flight", hello.max_in_flight or 64)
        kw.setdefault("heartbeat_ms", 60_000)
        kw.setdefault("liveness_intervals", 3)
        kw.setdefault("ack_timeout_ms", 30_000)
        kw.setdefault("node_id", "fake")
        self.send(pb.Frame(welcome=pb.Welcome(**kw)))
        return hello

    def deliver(self, delivery_id: int, value: bytes = b"v", partition: int = 0, offset: int = 0, **kw) -> None:
        self.send(pb.Frame(deliver=pb.Deliver(delivery_id=delivery_id, partition=partition, offset=offset,
                                              value=value, attempt=1, **kw)))

    def at_eof(self, timeout: float = TIMEOUT) -> bool:
        """Reads until the client closes; True at EOF."""
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
                self.frames += self.reader.feed(data)
        except (socket.timeout, ConnectionResetError):
            return False

    def close(self) -> None:
        self.sock.close()


class FakeDaemon:
    """Listens on 127.0.0.1:0; accept() returns the next connection."""

    def __init__(self, ssl_context=None) -> None:
        self.ssl_context = ssl_context  # a server context: the connections speak TLS
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.addr = "127.0.0.1:%d" % self.lsock.getsockname()[1]
        self._conns: "queue.Queue[Conn]" = queue.Queue()
        self._all: List[Conn] = []
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def _accept(self) -> None:
        while True:
            try:
                s, _ = self.lsock.accept()
            except OSError:
                return
            if self.ssl_context is not None:
                try:
                    s.settimeout(TIMEOUT)
                    s = self.ssl_context.wrap_socket(s, server_side=True)
                except OSError:
                    s.close()
                    continue
            c = Conn(s)
            self._all.append(c)
            self._conns.put(c)

    def accept(self, timeout: float = TIMEOUT) -> Conn:
        try:
            return self._conns.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no connection to {self.addr} within {timeout}s") from None

    def no_connection(self, timeout: float) -> bool:
        try:
            self._conns.get(timeout=timeout)
            return False
        except queue.Empty:
            return True

    def close(self) -> None:
        self.lsock.close()
        for c in self._all:
            c.close()


def frame_len(n: int) -> bytes:
    return struct.pack(">I", n)
