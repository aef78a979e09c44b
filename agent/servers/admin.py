"""The admin gRPC API (``protos/elastic_sidecar/v1/admin.proto``).

On the coordinator every call is served: commands become
:class:`~agent.core.model.OperatorCommand` events for the decision core, which
decides whether they fit the job's state (``Decision.rejected`` becomes
FAILED_PRECONDITION with its text). On a worker sidecar the API is read-only:
GetStatus about itself and WatchEvents of its local events; commands answer
FAILED_PRECONDITION.

The server also carries ``grpc.health.v1`` and server reflection (v1alpha),
both reachable without a token. Malformed requests get INVALID_ARGUMENT naming
the field.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from agent import constants as C
from agent import log as logmod
from agent.auth import BearerAuthInterceptor, BearerToken, server_credentials
from agent.core.model import Decision, OperatorCommand
from agent.metrics import ServerMetrics
from agent.servers.contract import CoordinatorView, WorkerView
from agent.servers.feed import Feed
from agent.servers.listen import ListenError, bind
from agent.servers.status import coordinator_status, decision_event, worker_status
from protos.elastic_sidecar.v1 import admin_pb2, admin_pb2_grpc

log = logmod.get("admin")

SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name
DEFAULT_CHECKPOINT_TIMEOUT = 120.0
"""Seconds Checkpoint waits for the trainer's flush when the request says 0."""
MAX_REASON = 1000
READ_ONLY = "read-only on workers: send commands to the coordinator's admin API"


async def watch(feed: Feed, backlog: int, context: grpc.aio.ServicerContext) -> AsyncIterator[admin_pb2.DecisionEvent]:
    """The newest ``backlog`` records, then live ones until the caller goes away.

    The number of backlog records is sent first as initial metadata
    (``backlog-count``), so a client that wants only the backlog knows when to stop.
    """
    if backlog < 0:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"backlog must be >= 0, got {backlog}")
    # Snapshot and subscribe without yielding in between: no record is missed or sent twice.
    past = list(feed.recent)[-backlog:] if backlog else []
    q = feed.subscribe()
    try:
        await context.send_initial_metadata((("backlog-count", str(len(past))),))
        for rec in past:
            yield decision_event(rec)
        while True:
            try:
                rec = await asyncio.wait_for(q.get(), timeout=1.0)
            except TimeoutError:
                if q not in feed.subscribers:
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED, "this reader fell too far behind; watch again"
                    )
                continue
            yield decision_event(rec)
    finally:
        feed.unsubscribe(q)


def _reason(text: str, field: str = "reason", required: bool = True) -> str | None:
    """The error text for a bad reason, or None when it is fine."""
    if required and not text.strip():
        return f"{field} is required: say why (it goes into the logs, the journal and the decision stream)"
    if len(text) > MAX_REASON:
        return f"{field} is {len(text)} characters long; keep it under {MAX_REASON}"
    return None


class CoordinatorAdmin(admin_pb2_grpc.AdminServicer):
    """Every call, on the coordinator."""

    def __init__(self, coord: CoordinatorView, metrics: ServerMetrics | None = None) -> None:
        self.c = coord
        self.metrics = metrics

    async def _command(
        self, context: grpc.aio.ServicerContext, method: str, ev: OperatorCommand
    ) -> tuple[Decision, admin_pb2.CommandReply]:
        target = {} if ev.slice is None else {"slice": ev.slice}
        log.info("admin command", method=method, peer=context.peer(), kind=ev.kind, reason=ev.reason, **target)
        d = await self.c.request(ev)
        if d.rejected:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, d.rejected)
        reply = admin_pb2.CommandReply(generation=d.state.generation, phase=str(d.state.phase), reason=d.reason)
        return d, reply

    async def _check_reason(self, context: grpc.aio.ServicerContext, text: str, required: bool = True) -> None:
        problem = _reason(text, required=required)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)

    async def GetStatus(self, request: admin_pb2.GetStatusRequest, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return coordinator_status(self.c)

    async def WatchEvents(  # noqa: N802
        self, request: admin_pb2.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[admin_pb2.DecisionEvent]:
        async for ev in watch(self.c.feed, request.backlog, context):
            yield ev

    async def Hold(self, request: admin_pb2.HoldRequest, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self._check_reason(context, request.reason)
        return (await self._command(context, "Hold", OperatorCommand("hold", request.reason.strip())))[1]

    async def Resume(self, request: admin_pb2.ResumeRequest, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self._check_reason(context, request.reason)
        return (await self._command(context, "Resume", OperatorCommand("resume", request.reason.strip())))[1]

    async def DrainSlice(self, request: admin_pb2.DrainSliceRequest, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return await self._slice_command(context, "DrainSlice", "drain", request.slice, request.reason)

    async def UndrainSlice(self, request: admin_pb2.UndrainSliceRequest, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return await self._slice_command(
            context, "UndrainSlice", "undrain", request.slice, request.reason, force=request.force
        )

    async def _slice_command(
        self, context: grpc.aio.ServicerContext, rpc: str, kind: str, slice_index: int, reason: str, force: bool = False
    ) -> Any:
        """An operator command naming one slice (drain, undrain): the slice must be one of the job's."""
        n = self.c.state.policy.num_slices
        if not 0 <= slice_index < n:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"slice {slice_index} is out of range: this job has slices 0..{n - 1}",
            )
        await self._check_reason(context, reason)
        ev = OperatorCommand(kind, reason.strip(), slice=slice_index, force=force)
        return (await self._command(context, rpc, ev))[1]

    async def Abort(self, request: admin_pb2.AbortRequest, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self._check_reason(context, request.reason)
        ev = OperatorCommand("abort", request.reason.strip(), restart=request.restart)
        return (await self._command(context, "Abort", ev))[1]

    async def Checkpoint(self, request: admin_pb2.CheckpointRequest, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        timeout = request.timeout_seconds
        if not math.isfinite(timeout) or timeout < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"timeout_seconds must be >= 0 (0: the server's default of {DEFAULT_CHECKPOINT_TIMEOUT:g} s), "
                f"got {timeout:g}",
            )
        await self._check_reason(context, request.reason)
        timeout = timeout or DEFAULT_CHECKPOINT_TIMEOUT
        left = context.time_remaining()
        if left is not None:
            timeout = min(timeout, max(0.0, left))
        reason = request.reason.strip()
        t0 = time.monotonic()
        d, _ = await self._command(context, "Checkpoint", OperatorCommand("checkpoint", reason))
        try:
            flushed = await self.c.wait_flushed(d.state.generation, timeout)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the trainer did not report a committed checkpoint within {timeout:g} s "
                f"(the flush may still complete; see WatchEvents)",
            )
        log.info(
            "admin checkpoint committed",
            committed_step=flushed.committed_step,
            seconds=round(time.monotonic() - t0, 3),
            peer=context.peer(),
        )
        return admin_pb2.CheckpointReply(
            committed_step=flushed.committed_step,
            flush_seconds=flushed.flush_seconds,
            generation=flushed.generation,
        )


class WorkerAdmin(admin_pb2_grpc.AdminServicer):
    """The read-only subset, on a worker sidecar."""

    def __init__(self, worker: WorkerView) -> None:
        self.w = worker

    async def GetStatus(self, request: admin_pb2.GetStatusRequest, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return worker_status(self.w)

    async def WatchEvents(  # noqa: N802
        self, request: admin_pb2.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[admin_pb2.DecisionEvent]:
        async for ev in watch(self.w.feed, request.backlog, context):
            yield ev

    async def _refuse(self, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, READ_ONLY)

    async def Hold(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return await self._refuse(context)

    async def Resume(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return await self._refuse(context)

    async def DrainSlice(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return await self._refuse(context)

    async def UndrainSlice(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return await self._refuse(context)

    async def Abort(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return await self._refuse(context)

    async def Checkpoint(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return await self._refuse(context)


@dataclass(frozen=True)
class _Undecodable:
    """Request bytes that are not the method's message (stands in for the request)."""

    error: str


class _CountsAbort:
    """A servicer context that counts its call once, and in ``abort`` before grpc sends the status.

    grpc.aio's ``abort`` sends the status to the client and only then raises, so a count taken
    on the way out would land after the client already has its answer (and a scrape right
    after a refused call could miss it). Everything else is the wrapped context's.
    """

    def __init__(self, context: grpc.aio.ServicerContext, inc: Callable[[str], None]) -> None:
        self._context = context
        self._inc = inc
        self._counted = False

    def count(self, code: str) -> None:
        if not self._counted:
            self._counted = True
            self._inc(code)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        self.count(code.name if isinstance(code, grpc.StatusCode) else str(code))
        await self._context.abort(code, details, trailing_metadata)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._context, attr)


class _CallCounter(grpc.aio.ServerInterceptor):
    """Counts admin calls by method and final status code (``elastic_sidecar_admin_requests_total``)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method or ""
        if handler is None or not method.startswith(f"/{SERVICE}/"):
            return handler
        name = method.rsplit("/", 1)[-1]
        counter = self.metrics.admin_requests

        def code_of(context: grpc.aio.ServicerContext) -> str:
            code = context.code()
            if isinstance(code, grpc.StatusCode):
                return code.name
            return "OK" if code in (None, 0) else str(code)

        def inc(code: str) -> None:
            counter.labels(name, code).inc()

        decode = handler.request_deserializer

        def tolerant_decode(raw: bytes) -> Any:
            # Undecodable bytes would otherwise end the call as UNKNOWN with a traceback in
            # the log, before any handler (and this counter) sees it.
            try:
                return decode(raw) if decode is not None else raw
            except Exception as e:
                return _Undecodable(f"{type(e).__name__}: {e}")

        async def refuse_corrupt(request: Any, context: Any) -> None:
            if isinstance(request, _Undecodable):
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the request is not a valid {SERVICE}.{name} request message ({request.error[:200]})",
                )

        if handler.response_streaming:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                ctx = _CountsAbort(context, inc)
                cancelled = False
                try:
                    await refuse_corrupt(request, ctx)
                    async for item in inner_stream(request, ctx):
                        yield item
                except (asyncio.CancelledError, GeneratorExit):
                    cancelled = True
                    raise
                finally:
                    ctx.count("CANCELLED" if cancelled else code_of(context))

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=tolerant_decode,
                response_serializer=handler.response_serializer,
            )
        inner = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            ctx = _CountsAbort(context, inc)
            try:
                await refuse_corrupt(request, ctx)
                return await inner(request, ctx)
            finally:
                ctx.count(code_of(context))

        return grpc.unary_unary_rpc_method_handler(
            unary,
            request_deserializer=tolerant_decode,
            response_serializer=handler.response_serializer,
        )


@dataclass
class AdminServer:
    """A running admin server: the Admin service, grpc.health.v1 and reflection on one port."""

    server: grpc.aio.Server
    port: int
    address: str
    tls: bool
    health: health.aio.HealthServicer

    async def stop(self, grace: float = 0.5) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def start_admin_server(
    servicer: admin_pb2_grpc.AdminServicer,
    listen: str,
    *,
    token: BearerToken | None,
    metrics: ServerMetrics | None,
    tls_cert: bytes | None = None,
    tls_key: bytes | None = None,
) -> AdminServer:
    """Serve ``servicer`` on ``listen``; OSError when the address cannot be bound.

    A configured address that cannot be bound is fatal at start-up: a sidecar
    whose port another process holds would otherwise let operators steer that
    other process.
    """
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if metrics is not None:
        interceptors.append(_CallCounter(metrics))
    if token is not None:
        on_refused = None if metrics is None else (lambda svc, why: metrics.auth_failures.labels(svc, why).inc())
        # Outermost: a refused call never reaches the counter's wrapped handler.
        interceptors.insert(0, BearerAuthInterceptor(token, [SERVICE], label="admin", on_refused=on_refused))
    server = grpc.aio.server(options=list(C.GRPC_SERVER_OPTIONS), interceptors=interceptors)
    admin_pb2_grpc.add_AdminServicer_to_server(servicer, server)
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    reflection.enable_server_reflection(
        [SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    tls = tls_cert is not None and tls_key is not None
    creds = server_credentials(tls_cert, tls_key) if tls_cert is not None and tls_key is not None else None
    try:
        port = bind(server, listen, "--admin-listen", creds)
    except ListenError as e:
        raise ListenError(f"admin API: {e}") from None
    await server.start()
    await hs.set("", health_pb2.HealthCheckResponse.SERVING)
    await hs.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    host = listen.rpartition(":")[0]
    addr = f"{host}:{port}"
    log.info(
        "admin API listening",
        address=addr,
        tls=tls,
        authenticated=token is not None,
        read_only=isinstance(servicer, WorkerAdmin),
    )
    return AdminServer(server, port, addr, tls, hs)
