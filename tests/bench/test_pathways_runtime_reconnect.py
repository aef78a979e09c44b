"""The stand-in Pathways runtime sees a returning worker promptly (no gRPC reconnect backoff).

A stand-in must not add delays the real system lacks: with gRPC's default reconnect backoff
(1 s, x1.6 a failed attempt) a worker back after a 6 s outage was seen seconds late, which the
example trainer paid before growing back (issue 26). Real gRPC servers on loopback.
"""

from __future__ import annotations

import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bench.common import free_port
from standins.pathways_runtime import PathwaysRuntime

OUTAGE_S = 6.0
"""Long enough for gRPC's default backoff to have pushed its next attempt ~3 s past the return."""
SEEN_WITHIN_S = 1.5
"""Generous: the watcher retries within 0.5 s and its channel within 0.25 s."""


def _serve(port: int) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


def test_a_returning_worker_is_seen_and_joins_the_collective_promptly() -> None:
    import jax

    port = free_port()
    server = _serve(port)
    runtime = PathwaysRuntime({0: [f"127.0.0.1:{port}"]}, collective_timeout=2.0).start()
    try:
        assert runtime.wait_available([0], timeout=10.0)
        runtime.collective([0])  # the cached collective channel is connected
        server.stop(0)
        deadline = time.monotonic() + 10.0
        while 0 in runtime.available_slices() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runtime.lost_slices() == {0}
        with pytest.raises(jax.errors.JaxRuntimeError, match="DATA_LOSS"):
            runtime.collective([0])  # the faulted step's collective fails on the cached channel
        time.sleep(OUTAGE_S)
        server = _serve(port)
        back = time.monotonic()
        assert runtime.wait_available([0], timeout=30.0)
        seen = time.monotonic() - back
        assert seen < SEEN_WITHIN_S, f"the returned worker was seen {seen:.2f} s after it came back"
        runtime.collective([0])  # and the cached channel reaches it again
    finally:
        runtime.stop()
        server.stop(0)


def test_stop_ends_every_watcher_and_closes_the_channels() -> None:
    """Nothing of the runtime is left inside gRPC when the trainer exits (a thread in a stream while the
    interpreter finalizes can crash the process: grpc/grpc#18456), and stop() does not wait them out."""
    port = free_port()
    server = _serve(port)
    runtime = PathwaysRuntime({s: [f"127.0.0.1:{port}"] for s in range(3)}, collective_timeout=2.0).start()
    try:
        assert runtime.wait_available([0, 1, 2], timeout=10.0)
        runtime.collective([0, 1, 2])  # a cached channel per target
        t0 = time.monotonic()
        runtime.stop()
        took = time.monotonic() - t0
        assert not [t.name for t in runtime._threads if t.is_alive()]  # noqa: SLF001
        assert not runtime._channels and not runtime._watches  # noqa: SLF001
        assert took < 1.0, took  # the streams were cancelled (about 2 ms), not waited out (3.3 s without it)
    finally:
        server.stop(0)
