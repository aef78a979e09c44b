"""Pluggable health checkers for what runs beside a worker sidecar.

No public Pathways health API is documented (FACTS section 2), so a checker is
a plug-in: :class:`GrpcHealthWatch` follows ``grpc.health.v1.Health/Watch``
where a server serves it, :class:`TcpConnectCheck` only proves the port
accepts connections. Both report a verdict through a callback and never claim
healthy when they cannot see: a broken stream or a refused connect is
unhealthy, and they reconnect with capped exponential backoff.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent import constants as C

Verdict = Callable[[bool, str], None]
"""on_change(healthy, detail): called only when the verdict changes."""


class HealthChecker(abc.ABC):
    """Watches one target; calls ``on_change`` when it turns healthy or unhealthy."""

    REGISTRY: dict[str, type[HealthChecker]] = {}

    def __init__(self, target: str, on_change: Verdict, *, backoff_max: float = 1.0) -> None:
        self.target = target
        self._on_change = on_change
        self.healthy: bool | None = None
        self.backoff_max = backoff_max

    def __init_subclass__(cls, kind: str = "", **kw: object) -> None:
        super().__init_subclass__(**kw)
        if kind:
            HealthChecker.REGISTRY[kind] = cls

    @classmethod
    def create(cls, kind: str, target: str, on_change: Verdict) -> HealthChecker:
        try:
            impl = cls.REGISTRY[kind]
        except KeyError:
            raise ValueError(f"unknown health check kind {kind!r}; known: {sorted(cls.REGISTRY)}") from None
        return impl(target, on_change)

    def _set(self, healthy: bool, detail: str) -> None:
        if healthy != self.healthy:
            self.healthy = healthy
            self._on_change(healthy, detail)

    @abc.abstractmethod
    async def run(self) -> None:
        """Watch until cancelled."""


class GrpcHealthWatch(HealthChecker, kind="grpc"):
    """grpc.health.v1 Watch with keepalive, so a hung server is noticed too."""

    service = ""

    async def run(self) -> None:
        delay = 0.05
        while True:
            try:
                async with grpc.aio.insecure_channel(self.target, options=list(C.GRPC_KEEPALIVE_OPTIONS)) as ch:
                    stub = health_pb2_grpc.HealthStub(ch)
                    call = stub.Watch(health_pb2.HealthCheckRequest(service=self.service))
                    async for resp in call:
                        delay = 0.05
                        ok = resp.status == health_pb2.HealthCheckResponse.SERVING
                        self._set(ok, f"{self.target} {health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)}")
                    self._set(False, f"{self.target} health stream ended")
            except grpc.aio.AioRpcError as e:
                self._set(False, f"{self.target} {e.code().name}: {e.details()}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff_max)


class TcpConnectCheck(HealthChecker, kind="tcp"):
    """For targets that serve no health service: healthy while a connect succeeds."""

    interval = 0.25
    timeout = 0.5

    async def run(self) -> None:
        host, _, port = self.target.rpartition(":")
        host = host.strip("[]")
        while True:
            try:
                _, w = await asyncio.wait_for(asyncio.open_connection(host, int(port)), self.timeout)
                w.close()
                self._set(True, f"{self.target} accepts connections")
            except (OSError, TimeoutError) as e:
                self._set(False, f"{self.target} connect failed: {e or type(e).__name__}")
            await asyncio.sleep(self.interval)


async def probe_once(kind: str, target: str, timeout: float) -> tuple[bool | None, str]:
    """One check of ``target`` (a "grpc" health Check or a "tcp" connect): (healthy, detail).

    Healthy is True, False when the target says it is down (refused, or an answer other than
    SERVING), or None when no answer came within ``timeout``: slow and hung look alike, and
    only :func:`probe` decides. None is falsy: it never reads as healthy.
    """
    host, _, port = target.rpartition(":")
    if kind == "tcp":
        try:
            _, w = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout)
            w.close()
            return True, f"{target} accepts connections"
        except TimeoutError:  # before OSError, its base class
            return None, f"{target} connect timed out after {timeout} s"
        except (OSError, ValueError) as e:
            return False, f"{target} connect failed: {e or type(e).__name__}"
    if kind != "grpc":
        return False, f"unknown health check kind {kind!r}"
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            resp = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout
            )
    except grpc.aio.AioRpcError as e:
        # grpc.io "Status codes and their use in gRPC": DEADLINE_EXCEEDED is "no response received
        # before deadline expires", whether the server is slow or never answers; UNAVAILABLE is the
        # connection failing or breaking (a refused connect: nothing listens), and any other code is
        # the server's own answer.
        ambiguous = e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        return (None if ambiguous else False), f"{target} {e.code().name}"
    ok = resp.status == health_pb2.HealthCheckResponse.SERVING
    return ok, f"{target} {health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)}"


async def probe(kind: str, target: str, timeout: float, attempts: int, pause: float) -> tuple[bool, str]:
    """Check ``target`` until it answers, at most ``attempts`` times ``pause`` s apart: (healthy, detail).

    The coordinator asks this itself before it calls a host lost. A refusal or a NOT_SERVING is
    believed at once; a check that got no answer is repeated, so one slow moment (a busy node or
    network) is no loss, and a host that never answers is down after ``attempts`` checks.
    """
    detail = ""
    for n in range(attempts):
        if n:
            await asyncio.sleep(pause)
        ok, detail = await probe_once(kind, target, timeout)
        if ok is not None:
            return ok, detail
    return False, f"{detail} ({attempts} checks in a row)"
