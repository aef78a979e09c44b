"""A small TrainerLink server on loopback that a test steers by hand.

Real gRPC (grpcio's threaded server): the trainer's :class:`SidecarLink`
talks to it exactly as to the coordinator. The test sends commands, reads
what the trainer sent, can demand a bearer token, and can stop the server and
start it again on the same port (a sidecar gone and back).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from protos.elastic_sidecar.v1 import trainer_pb2, trainer_pb2_grpc
from simjob.ports import free_port

_SERVER_OPTIONS = [
    # The trainer link pings every 0.5 s (as the coordinator allows): never answer with too_many_pings.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 100),
    ("grpc.http2.min_time_between_pings_ms", 100),
    ("grpc.http2.max_ping_strikes", 0),
]


class _Stream:
    def __init__(self, metadata: dict[str, str]) -> None:
        self.metadata = metadata
        self.outbox: queue.SimpleQueue[trainer_pb2.SidecarCommand] = queue.SimpleQueue()
        self.half_closed = threading.Event()
        """The trainer ended its side (``SidecarLink.close``): the sidecar ends the stream, as the coordinator does."""


class FakeSidecar(trainer_pb2_grpc.TrainerLinkServicer):
    def __init__(self, port: int | None = None, token: str | None = None) -> None:
        self.port = port or free_port()
        self.token = token
        self.address = f"127.0.0.1:{self.port}"
        self.received: list[trainer_pb2.TrainerMessage] = []
        self.metadata: list[dict[str, str]] = []
        """Invocation metadata of every Attach, accepted or not."""
        self.rejected = 0
        self._cond = threading.Condition()
        self._stream: _Stream | None = None
        self._server: grpc.Server | None = None

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> FakeSidecar:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=_SERVER_OPTIONS)
        trainer_pb2_grpc.add_TrainerLinkServicer_to_server(self, server)
        bound = server.add_insecure_port(self.address)
        assert bound == self.port, f"could not bind {self.address}"
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Gone at once, as a killed process: open streams end."""
        with self._cond:
            self._stream = None
        if self._server is not None:
            self._server.stop(0).wait(5)
            self._server = None

    def __enter__(self) -> FakeSidecar:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the test's side -----------------------------------------------------------

    def send(self, cmd: trainer_pb2.SidecarCommand, timeout: float = 10.0) -> None:
        """Send on the open stream (waits for the trainer to attach)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._stream is not None, timeout):
                raise AssertionError(f"no trainer attached to {self.address} within {timeout} s")
            assert self._stream is not None
            self._stream.outbox.put(cmd)

    def of(self, kind: str) -> list[Any]:
        with self._cond:
            return [getattr(m, kind) for m in self.received if m.WhichOneof("msg") == kind]

    def wait_for(self, cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
        with self._cond:
            if not self._cond.wait_for(cond, timeout):
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")

    def wait_for_message(self, kind: str, n: int = 1, timeout: float = 10.0) -> Any:
        """The ``n``-th message of ``kind`` (1-based), once it has arrived."""
        self.wait_for(lambda: len(self.of(kind)) >= n, f"{n} {kind} message(s)", timeout)
        return self.of(kind)[n - 1]

    # -- the servicer ------------------------------------------------------------

    def Attach(  # noqa: N802
        self, request_iterator: Iterator[trainer_pb2.TrainerMessage], context: grpc.ServicerContext
    ) -> Iterator[trainer_pb2.SidecarCommand]:
        md = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        with self._cond:
            self.metadata.append(md)
            self._cond.notify_all()
        if self.token is not None and md.get("authorization") != f"Bearer {self.token}":
            with self._cond:
                self.rejected += 1
                self._cond.notify_all()
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        stream = _Stream(md)

        def read() -> None:
            try:
                for m in request_iterator:
                    with self._cond:
                        self.received.append(m)
                        self._cond.notify_all()
                stream.half_closed.set()
            except grpc.RpcError:
                pass

        threading.Thread(target=read, daemon=True).start()
        with self._cond:
            self._stream = stream
            self._cond.notify_all()
        while context.is_active() and not stream.half_closed.is_set():
            try:
                yield stream.outbox.get(timeout=0.05)
            except queue.Empty:
                continue


def hold(
    gen: int, *, flush: bool = False, down: tuple[int, ...] = (), epoch: int = 0, reason: str = "test hold"
) -> trainer_pb2.SidecarCommand:
    return trainer_pb2.SidecarCommand(
        hold=trainer_pb2.Hold(generation=gen, flush=flush, down_slices=list(down), reason=reason), epoch=epoch
    )


def resume(gen: int, *slices: int, epoch: int = 0, memory: bool = True) -> trainer_pb2.SidecarCommand:
    source = trainer_pb2.Resume.MEMORY if memory else trainer_pb2.Resume.CHECKPOINT
    return trainer_pb2.SidecarCommand(
        resume=trainer_pb2.Resume(generation=gen, active_slices=list(slices), source=source, reason="test resume"),
        epoch=epoch,
    )


def flush(gen: int, *, epoch: int = 0) -> trainer_pb2.SidecarCommand:
    return trainer_pb2.SidecarCommand(flush=trainer_pb2.Flush(generation=gen, reason="test flush"), epoch=epoch)


def boundary_until(session: Any, step: int, timeout: float = 10.0) -> Any:
    """Call ``step_boundary`` as a training loop does until it returns a directive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d = session.step_boundary(step)
        if d is not None:
            return d
        time.sleep(0.002)
    raise TimeoutError(f"no directive within {timeout} s")


def call_within(fn: Callable[[], Any], limit: float) -> Any:
    """``fn()`` on a thread: its result, or what it raised; AssertionError if it is still blocked after ``limit`` s.

    A guard that does not fire then fails the test instead of hanging it.
    """
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as e:
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    if t.is_alive():
        raise AssertionError(f"still blocked after {limit} s")
    if "error" in out:
        raise out["error"]
    return out["result"]


def main() -> None:
    """``python -m tests.trainer_hooks.sidecar``: a sidecar in its own process (so a test can SIGSTOP it).

    Prints its port, answers the first hello with a resume on slice 0, and the
    first step report with a hold (generation 2, no flush).
    """
    sidecar = FakeSidecar().start()
    print(sidecar.port, flush=True)
    sidecar.wait_for_message("hello", timeout=60)
    sidecar.send(resume(1, 0))
    sidecar.wait_for_message("step", timeout=60)
    sidecar.send(hold(2))
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
