"""Stand-in for a Pathways worker on one TPU host (real port 29005).

Serves ``grpc.health.v1.Health`` on a loopback port and nothing else, which is
all the sidecar may assume of the real one. ``--not-serving-after S`` flips it
to NOT_SERVING after S seconds (fault injection for health-checker tests). :class:`SlowChecks` answers chosen
Checks late, in a test's own process.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


class SlowChecks(health.aio.HealthServicer):
    """grpc.health.v1 whose next ``slow`` Checks answer only after ``delay`` s (a busy or hung worker).

    For tests that run it in their own process; Watch is served as usual. ``checks`` counts every Check.
    """

    def __init__(self, delay: float = 1.0) -> None:
        super().__init__()
        self.delay = delay
        self.slow = 0
        self.checks = 0

    async def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        self.checks += 1
        if self.slow > 0:
            self.slow -= 1
            await asyncio.sleep(self.delay)
        return await super().Check(request, context)


async def serve_slow_checks(port: int, host: str = "127.0.0.1") -> tuple[grpc.aio.Server, SlowChecks]:
    """A :class:`SlowChecks` health server started on ``host:port`` in this process's event loop."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    hs = SlowChecks()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise RuntimeError(f"stand-in Pathways worker: cannot listen on {host}:{port}")
    await server.start()
    return server, hs


async def serve(port: int, host: str, not_serving_after: float | None) -> None:
    # Let health watchers ping as often as their keepalive asks (FACTS section 6).
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", 200),
            ("grpc.http2.min_time_between_pings_ms", 200),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
    )
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise SystemExit(f"stand-in Pathways worker: cannot listen on {host}:{port}")
    await server.start()
    await hs.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def flip() -> None:
        assert not_serving_after is not None
        await asyncio.sleep(not_serving_after)
        await hs.set("", health_pb2.HealthCheckResponse.NOT_SERVING)

    if not_serving_after is not None:
        asyncio.create_task(flip())
    # SIGUSR1 toggles serving, for tests that flap the health.
    state = {"serving": True}

    def toggle() -> None:
        state["serving"] = not state["serving"]
        st = health_pb2.HealthCheckResponse.SERVING if state["serving"] else health_pb2.HealthCheckResponse.NOT_SERVING
        asyncio.ensure_future(hs.set("", st))

    loop.add_signal_handler(signal.SIGUSR1, toggle)
    await stop.wait()
    await server.stop(0.2)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--not-serving-after", type=float, default=None)
    ns = ap.parse_args(argv)
    asyncio.run(serve(ns.port, ns.host, ns.not_serving_after))


if __name__ == "__main__":
    main()
