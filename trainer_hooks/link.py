"""The trainer's stream to its sidecar, kept on a background thread.

Plain synchronous grpcio (no asyncio, no aiohttp, no Pub/Sub client): the
training process only pays for a queue put per report and a deque check per
step. The link reconnects with backoff and greets the sidecar again with what
the trainer holds, so a restarted sidecar can pick up where it was.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from protos.elastic_sidecar.v1 import trainer_pb2, trainer_pb2_grpc

_KEEPALIVE = [
    ("grpc.keepalive_time_ms", 500),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.http2.ping_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
_CLOSE = object()


class SidecarLink:
    """Sends :class:`TrainerMessage` s, collects :class:`SidecarCommand` s.

    ``hello`` is called at every (re)connect to build the greeting.
    """

    def __init__(self, address: str, hello: Callable[[], trainer_pb2.TrainerHello]) -> None:
        self.address = address
        self._hello = hello
        self.inbox: collections.deque[trainer_pb2.SidecarCommand] = collections.deque()
        self._arrived = threading.Condition()
        self._q: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._closed = threading.Event()
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sidecar-link", daemon=True)

    def start(self) -> SidecarLink:
        self._thread.start()
        return self

    def send(self, msg: trainer_pb2.TrainerMessage) -> None:
        self._q.put(msg)

    def next_command(self, timeout: float | None = None) -> trainer_pb2.SidecarCommand | None:
        """Block until a command arrives (or ``timeout`` passes: None)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._arrived:
            while not self.inbox:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._arrived.wait(left if left is not None else 1.0)
            return self.inbox.popleft()

    def close(self) -> None:
        self._closed.set()
        self._q.put(_CLOSE)

    def flush_outbox(self, timeout: float = 2.0) -> None:
        """Best effort: let queued reports leave before the process exits."""
        deadline = time.monotonic() + timeout
        while not self._q.empty() and time.monotonic() < deadline and self.connected.is_set():
            time.sleep(0.01)

    def _requests(self, q: queue.SimpleQueue[object]) -> Iterator[trainer_pb2.TrainerMessage]:
        yield trainer_pb2.TrainerMessage(hello=self._hello())
        while True:
            m = q.get()
            if m is _CLOSE:
                return
            yield m  # type: ignore[misc]

    def _run(self) -> None:
        delay = 0.05
        while not self._closed.is_set():
            q = self._q
            try:
                with grpc.insecure_channel(self.address, options=_KEEPALIVE) as ch:
                    stub = trainer_pb2_grpc.TrainerLinkStub(ch)
                    responses = stub.Attach(self._requests(q), wait_for_ready=True)
                    self.connected.set()
                    for cmd in responses:
                        delay = 0.05
                        with self._arrived:
                            self.inbox.append(cmd)
                            self._arrived.notify_all()
            except grpc.RpcError:
                pass
            finally:
                self.connected.clear()
            if self._closed.is_set():
                return
            # A fresh queue per stream: the old request iterator may still be
            # blocked on the old one.
            self._q = queue.SimpleQueue()
            q.put(_CLOSE)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
