"""The coordinator sidecar: one per job, beside the trainer (the Pathways head).

Sources -> decision core -> executors:

* sources: the Peer service (worker sidecars register and heartbeat over one
  stream each; a closed stream or a missed heartbeat deadline is a lost host),
  the TrainerLink service (steps, slice errors and acknowledgements from the
  trainer hooks) and a ticker that lets deadlines fire;
* one decision loop feeds each event to :func:`agent.core.decide` and keeps the
  state; nothing else changes it;
* executors send hold/resume/abort to the trainer, fan commands out to the
  workers, append to the journal, write the state file and log.

Beside them it serves operators (:mod:`agent.servers`): the admin gRPC API on
``--admin-listen`` (its commands are events for the same loop) and HTTP
health, readiness, metrics and a status page on ``--http-listen``. Worker
registrations need the peer token when ``--peer-token-file`` is given; the
TrainerLink on the same port is never authenticated (see :mod:`agent.auth`).

Every decision line of a recovery carries Cloud Logging's operation
``recovery-<generation>`` (the generation of the hold that began it), with
``first`` on the hold and ``last`` when the trainer acknowledges the resume
(or the job fails), so the Logs Explorer groups a recovery's lines.
"""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import IO, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from agent import constants as C
from agent import log as logmod
from agent import statefile
from agent.auth import BearerAuthInterceptor
from agent.config import CoordinatorConfig
from agent.core import decide, initial_state
from agent.core.model import (
    AbortTrainer,
    Action,
    Decision,
    Event,
    ExitCoordinator,
    FlushTrainer,
    HoldTrainer,
    NodeNotice,
    Phase,
    ResumeSource,
    ResumeTrainer,
    State,
    TellWorkers,
    Tick,
    TrainerAttached,
    TrainerDetached,
    TrainerFinished,
    TrainerFlushed,
    TrainerHeld,
    TrainerResumed,
    TrainerSettings,
    TrainerSliceError,
    TrainerStepped,
    WorkerHealth,
    WorkerJoined,
    WorkerLost,
)
from agent.metrics import Metrics
from protos.elastic_sidecar.v1 import peer_pb2, peer_pb2_grpc, trainer_pb2, trainer_pb2_grpc

log = logmod.get("coordinator")
PEER_SERVICE = peer_pb2.DESCRIPTOR.services_by_name["Peer"].full_name
TICK_SECONDS = 0.2
"""Deadlines (start, hold, wait, rejoin) are seconds to minutes long: a coarse tick
is enough, and an idle coordinator should cost next to nothing."""
EOF_GRACE_SECONDS = 0.05


@dataclass
class _Conn:
    """One open stream to a worker or the trainer: its outgoing queue."""

    outbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    last_seen: float = field(default_factory=time.monotonic)
    """When the peer last sent a message (tells a hung peer from a killed one)."""


def _to_trainer_command(a: Action) -> trainer_pb2.SidecarCommand | None:
    match a:
        case HoldTrainer():
            return trainer_pb2.SidecarCommand(
                hold=trainer_pb2.Hold(
                    generation=a.generation, flush=a.flush, down_slices=sorted(a.down_slices), reason=a.reason
                )
            )
        case ResumeTrainer():
            src = trainer_pb2.Resume.MEMORY if a.source == ResumeSource.MEMORY else trainer_pb2.Resume.CHECKPOINT
            return trainer_pb2.SidecarCommand(
                resume=trainer_pb2.Resume(
                    generation=a.generation, active_slices=sorted(a.active), source=src, reason=a.reason
                )
            )
        case AbortTrainer():
            return trainer_pb2.SidecarCommand(
                abort=trainer_pb2.Abort(generation=a.generation, exit_code=a.exit_code, reason=a.reason)
            )
        case FlushTrainer():
            return trainer_pb2.SidecarCommand(flush=trainer_pb2.Flush(generation=a.generation, reason=a.reason))
    return None


def _action_record(a: Action) -> dict[str, Any]:
    d: dict[str, Any] = {"type": type(a).__name__}
    for k, v in vars(a).items():
        d[k] = sorted(v) if isinstance(v, frozenset) else (str(v) if isinstance(v, ResumeSource) else v)
    return d


class Coordinator:
    """Owns the state; everything else talks to it through :meth:`submit` or :meth:`request`."""

    def __init__(self, cfg: CoordinatorConfig) -> None:
        self.cfg = cfg
        self.events: asyncio.Queue[tuple[Event, asyncio.Future[Decision] | None]] = asyncio.Queue()
        self.metrics = Metrics("coordinator")
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=500)
        """The newest decisions, for WatchEvents backlogs and the status page."""
        self.subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self._flush_waiters: list[tuple[int, asyncio.Future[TrainerFlushed]]] = []
        self.started_at = time.time()
        self.last_reason = ""
        self.workers: dict[tuple[int, int], _Conn] = {}
        self.trainer: _Conn | None = None
        self.exit_code: asyncio.Future[int] | None = None
        self.state: State = initial_state(cfg.policy, time.monotonic())
        self._persisted: dict[str, Any] | None = None
        self._journal: IO[str] | None = None
        self.port: int = 0
        self.server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()
        self.serving = False
        """The peer + trainer-link server is up (readiness)."""
        self.intake: Any = None
        self.admin: Any = None
        """The admin server (:class:`agent.servers.admin.AdminServer`) when it listens."""
        self.http: Any = None
        """The HTTP server (:class:`agent.servers.http.HttpServer`) when it listens."""
        self._tasks: list[asyncio.Task[None]] = []
        self._recovery: int | None = None
        """Generation of the hold that began the recovery in progress (its log operation id)."""

    # -- sources -------------------------------------------------------------

    def submit(self, ev: Event) -> None:
        self.events.put_nowait((ev, None))

    async def request(self, ev: Event) -> Decision:
        """Submit an event and wait until the decision about it is recorded."""
        fut: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self.events.put_nowait((ev, fut))
        return await fut

    async def wait_flushed(self, generation: int, timeout: float) -> TrainerFlushed:
        """The trainer's next flush acknowledgement at ``generation`` or later."""
        fut: asyncio.Future[TrainerFlushed] = asyncio.get_running_loop().create_future()
        self._flush_waiters.append((generation, fut))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._flush_waiters = [(g, f) for g, f in self._flush_waiters if f is not fut]

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=1000)
        self.subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[dict[str, Any]]) -> None:
        self.subscribers.discard(q)

    # -- the loop ------------------------------------------------------------

    def _load_state(self) -> None:
        path = self.cfg.state_file
        if path is None or not path.exists():
            return
        self.state = statefile.restore(path, self.state, time.monotonic())
        log.info(
            "restored coordinator state",
            state_file=str(path),
            phase=str(self.state.phase),
            generation=self.state.generation,
            active=sorted(self.state.active),
        )
        self._persisted = statefile.snapshot(self.state)

    async def _decision_loop(self) -> None:
        while True:
            ev, fut = await self.events.get()
            try:
                d = self.apply(ev, time.monotonic())
            except Exception as e:  # a bug must not take the daemon down with it
                log.exception("failed to handle event", trigger=type(ev).__name__)
                if fut is not None and not fut.done():
                    fut.set_exception(e)
                continue
            if fut is not None and not fut.done():
                fut.set_result(d)

    def apply(self, ev: Event, now: float) -> Decision:
        before = self.state
        d = decide(before, ev, now)
        self.state = d.state
        self.metrics.observe(ev, d, before, now)
        if isinstance(ev, TrainerFlushed):
            for g, f in self._flush_waiters:
                if ev.generation >= g and not f.done():
                    f.set_result(ev)
        self._record(ev, d, before)
        self._persist()
        for a in d.actions:
            self._execute(a)
        return d

    def _record(self, ev: Event, d: Decision, before: State) -> None:
        quiet = isinstance(ev, (Tick, TrainerStepped)) and not d.actions and d.state.phase == before.phase
        if quiet:
            return
        s = d.state
        fields: dict[str, Any] = {
            "trigger": type(ev).__name__,
            "phase": str(s.phase),
            "generation": s.generation,
            "active_slices": sorted(s.active),
            "up_slices": sorted(s.up_slices()),
            "actions": [_action_record(a) for a in d.actions],
        }
        flags: dict[str, bool] = {}
        if self._recovery is None and any(isinstance(a, HoldTrainer) for a in d.actions):
            self._recovery = s.generation
            flags["first"] = True
        if self._recovery is not None:
            fields["operation"] = f"recovery-{self._recovery}"
            resumed = (
                isinstance(ev, TrainerResumed)
                and ev.generation == s.generation
                and s.phase == Phase.RUNNING
                and not s.trainer.resume_pending
            )
            if resumed or s.phase.terminal:
                flags["last"] = True
                self._recovery = None
        log.info(d.reason, **fields, **({"operation_flags": flags} if flags else {}))
        self.last_reason = d.reason
        rec = {"time": time.time(), "reason": d.reason, **{k: v for k, v in fields.items() if k != "operation"}}
        self.recent.append(rec)
        for q in list(self.subscribers):
            try:
                q.put_nowait(rec)
            except asyncio.QueueFull:
                self.subscribers.discard(q)  # a reader that cannot keep up is dropped
        if self._journal is not None:
            rec = {"time": time.time(), "reason": d.reason, **fields, "event_detail": _event_detail(ev)}
            self._journal.write(json.dumps(rec, default=str) + "\n")
            self._journal.flush()

    def _persist(self) -> None:
        if self.cfg.state_file is None:
            return
        snap = statefile.snapshot(self.state)
        if snap != self._persisted:
            statefile.write(self.cfg.state_file, self.state)
            self._persisted = snap

    # -- executors -----------------------------------------------------------

    def _execute(self, a: Action) -> None:
        match a:
            case HoldTrainer() | ResumeTrainer() | AbortTrainer() | FlushTrainer():
                cmd = _to_trainer_command(a)
                if self.trainer is None:
                    log.warning(
                        "no trainer attached; command will be repeated when it attaches", command=type(a).__name__
                    )
                else:
                    self.trainer.outbox.put_nowait(cmd)
            case TellWorkers():
                msg = peer_pb2.CoordinatorMessage(
                    command=peer_pb2.PeerCommand(generation=a.generation, kind=a.kind, reason=a.reason)
                )
                for conn in self.workers.values():
                    conn.outbox.put_nowait(msg)
            case ExitCoordinator():
                if self.exit_code is not None and not self.exit_code.done():
                    # Give the streams a moment to deliver the last commands.
                    asyncio.get_running_loop().call_later(0.5, _set_result, self.exit_code, a.exit_code)

    # -- lifetime ------------------------------------------------------------

    async def start(self) -> None:
        self.exit_code = asyncio.get_running_loop().create_future()
        self._load_state()
        if self.cfg.journal is not None:
            self.cfg.journal.parent.mkdir(parents=True, exist_ok=True)
            self._journal = open(self.cfg.journal, "a", encoding="utf-8")  # noqa: SIM115
        interceptors = []
        if self.cfg.peer_token is not None:
            interceptors.append(
                BearerAuthInterceptor(
                    self.cfg.peer_token,
                    [PEER_SERVICE],
                    label="peer",
                    on_refused=lambda svc, why: self.metrics.auth_failures.labels(svc, why).inc(),
                )
            )
        self.server = grpc.aio.server(options=list(C.GRPC_SERVER_KEEPALIVE_OPTIONS), interceptors=interceptors)
        peer_pb2_grpc.add_PeerServicer_to_server(PeerService(self), self.server)
        trainer_pb2_grpc.add_TrainerLinkServicer_to_server(TrainerLinkService(self), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(self.cfg.listen)
        if self.port == 0:
            raise OSError(f"could not listen on {self.cfg.listen}")
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.serving = True
        self._tasks = [
            asyncio.create_task(self._decision_loop(), name="decisions"),
            asyncio.create_task(self._ticker(), name="ticker"),
        ]
        if self.cfg.pubsub_subscription:
            from agent.sources.pubsub import PubSubIntake

            self.intake = PubSubIntake(
                self.cfg.pubsub_subscription,
                self._on_node_event,
                cluster=self.cfg.cluster_name,
                project=self.cfg.pubsub_project,
                on_count=self.metrics.count_pubsub,
                on_state=lambda up: self.metrics.pubsub_streaming.set(1 if up else 0),
            )
            self.intake.start()
        await self._start_operator_servers()
        log.info(
            "coordinator listening",
            address=self.cfg.listen,
            port=self.port,
            policy=vars(self.cfg.policy),
            peer_auth=self.cfg.peer_token is not None,
            admin=None if self.admin is None else self.admin.address,
            http=None if self.http is None else self.http.address,
        )

    async def _start_operator_servers(self) -> None:
        cfg = self.cfg
        if cfg.admin_listen is not None:
            from agent.servers.admin import CoordinatorAdmin, start_admin_server

            self.admin = await start_admin_server(
                CoordinatorAdmin(self, self.metrics),
                cfg.admin_listen,
                token=cfg.admin_token,
                metrics=self.metrics,
                tls_cert=cfg.tls_cert,
                tls_key=cfg.tls_key,
            )
        if cfg.http_listen is not None:
            from agent.servers.http import start_http_server
            from agent.servers.status import coordinator_status, status_document

            def status() -> dict[str, Any]:
                doc = status_document(coordinator_status(self), self)
                if self.intake is not None:
                    doc["notice_intake"] = self.intake.status()
                return doc

            self.http = await start_http_server(
                cfg.http_listen,
                status=status,
                ready=self.readiness,
                registry=self.metrics.registry,
            )

    def readiness(self) -> dict[str, bool]:
        """What /readyz checks. Worker sidecars are not waited for: this pod starts first."""
        # Not the Pub/Sub intake: notices are an optimisation, and a subscription or
        # permission mistake must not keep the job from starting (it shows in /status).
        checks = {"grpc": self.serving}
        if self.state.phase in (Phase.RUNNING, Phase.HOLDING, Phase.WAITING):
            checks["trainer"] = self.state.trainer.attached
        return checks

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            self.submit(Tick())

    async def _on_node_event(self, ev: Any) -> None:
        """A parsed Pub/Sub notice (:class:`agent.sources.gke_events.NodeEvent`): decide on it; the intake
        acks once this returns. Wall-clock times become decision-clock (monotonic) times here."""
        wall, mono = time.time(), time.monotonic()

        def clock(t: Any) -> float | None:
            return None if t is None else mono + (t.timestamp() - wall)

        notice = NodeNotice(
            kind=ev.what,
            source="pubsub",
            node=ev.node,
            node_pool=ev.node_pool,
            deadline=clock(ev.start if ev.start is not None else ev.end),
            event_time=None if ev.event_time is None else ev.event_time.timestamp(),
            cleared=ev.cleared,
            reason=ev.summary,
            starts_at=clock(ev.start) if str(ev.kind) == "scheduled" else None,
        )
        d = await self.request(notice)
        if not d.outcome:
            self.metrics.observe_notice_delivery("pubsub", time.monotonic() - mono)

    async def stop(self, grace: float = 1.0) -> None:
        self.serving = False
        if self.http is not None:
            await self.http.stop()
            self.http = None
        if self.admin is not None:
            await self.admin.stop(min(grace, 0.5))
            self.admin = None
        if self.intake is not None:
            await asyncio.to_thread(self.intake.stop)
        await self.health.enter_graceful_shutdown()
        for t in self._tasks:
            t.cancel()
        # End the open Join and Attach streams from our side first: a handler still running
        # when server.stop() cancels it is logged by grpc as a raw CancelledError traceback.
        for conn in [*self.workers.values(), *([self.trainer] if self.trainer is not None else [])]:
            conn.closed.set()
        if self.workers or self.trainer is not None:
            await asyncio.sleep(EOF_GRACE_SECONDS)
        if self.server is not None:
            await self.server.stop(grace)
        if self._journal is not None:
            self._journal.close()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        stop_requested: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop_requested.append, sig)
        try:
            await self.start()
        except OSError as e:
            log.error("coordinator could not start", error=str(e))
            await self.stop(grace=0)
            return C.EXIT_USAGE
        assert self.exit_code is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _set_result, self.exit_code, C.EXIT_OK)
        if stop_requested:
            _set_result(self.exit_code, C.EXIT_OK)
        code = await self.exit_code
        log.info("coordinator stopping", exit_code=code, phase=str(self.state.phase))
        await self.stop()
        return code


def _set_result(fut: asyncio.Future[int], value: int) -> None:
    if not fut.done():
        fut.set_result(value)


def _event_detail(ev: Event) -> dict[str, Any]:
    return {k: (sorted(v) if isinstance(v, frozenset) else v) for k, v in vars(ev).items()}


# ---------------------------------------------------------------------------
# the Peer service: worker sidecars
# ---------------------------------------------------------------------------


class PeerService(peer_pb2_grpc.PeerServicer):
    def __init__(self, coord: Coordinator) -> None:
        self.c = coord

    async def Join(
        self, request_iterator: AsyncIterator[peer_pb2.WorkerMessage], context: grpc.aio.ServicerContext
    ) -> None:  # noqa: N802
        cfg = self.c.cfg
        try:
            first = await asyncio.wait_for(context.read(), timeout=cfg.heartbeat_timeout * 4)
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "no Register message within the heartbeat timeout")
            return
        if first is grpc.aio.EOF or not first.HasField("register"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message on Join must be a Register")
            return
        reg = first.register
        ident = reg.identity
        p = cfg.policy
        if reg.job != cfg.job:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"job {reg.job!r} is not this coordinator's job {cfg.job!r}"
            )
            return
        if not (0 <= ident.slice < p.num_slices and 0 <= ident.host < p.hosts_per_slice):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"identity.slice={ident.slice} identity.host={ident.host} outside the job's "
                f"{p.num_slices} slices x {p.hosts_per_slice} hosts",
            )
            return
        if not ident.incarnation:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "identity.incarnation must not be empty")
            return
        key = (ident.slice, ident.host)
        conn = _Conn()
        old = self.c.workers.get(key)
        self.c.workers[key] = conn
        self.c.metrics.workers.set(len(self.c.workers))
        if old is not None:
            old.closed.set()
        self.c.submit(WorkerJoined(ident.slice, ident.host, ident.incarnation, ident.node, ident.node_pool))
        await context.write(
            peer_pb2.CoordinatorMessage(
                registered=peer_pb2.Registered(
                    generation=self.c.state.generation, heartbeat_interval_seconds=cfg.heartbeat_interval
                )
            )
        )
        cause = "stream_closed"
        reader = asyncio.create_task(self._read(context, ident, conn))
        writer = asyncio.create_task(self._write(context, conn))
        try:
            done, _ = await asyncio.wait(
                {reader, writer, asyncio.create_task(conn.closed.wait())}, return_when=asyncio.FIRST_COMPLETED
            )
            if reader in done and not reader.cancelled() and reader.exception() is None:
                cause = reader.result()
            elif conn.closed.is_set():
                cause = "replaced"
        finally:
            reader.cancel()
            writer.cancel()
            if self.c.workers.get(key) is conn:
                del self.c.workers[key]
            self.c.metrics.workers.set(len(self.c.workers))
            silent = time.monotonic() - conn.last_seen
            if cause in ("stream_closed", "shutdown") and silent > 2 * cfg.heartbeat_interval:
                # Already silent when the stream broke: the transport keepalive noticed a hung host first.
                cause = "heartbeat_timeout"
            if cause != "replaced":
                silent = time.monotonic() - conn.last_seen
                self.c.submit(WorkerLost(ident.slice, ident.host, ident.incarnation, cause, silent))

    async def _read(self, context: grpc.aio.ServicerContext, ident: peer_pb2.HostIdentity, conn: _Conn) -> str:
        timeout = self.c.cfg.heartbeat_timeout
        while True:
            try:
                msg = await asyncio.wait_for(context.read(), timeout=timeout)
            except TimeoutError:
                return "heartbeat_timeout"
            except (grpc.aio.AioRpcError, asyncio.CancelledError):
                return "stream_closed"
            if msg is grpc.aio.EOF:
                # grpc.aio also reads EOF from a call the peer's death cancelled; that
                # cancellation (which ends Join as "stream_closed") follows at once.
                await asyncio.sleep(EOF_GRACE_SECONDS)
                return "shutdown"
            conn.last_seen = time.monotonic()
            if msg.HasField("heartbeat"):
                continue
            if msg.HasField("report"):
                kind = msg.report.kind
                if kind in ("pathways_unhealthy", "pathways_healthy"):
                    self.c.submit(
                        WorkerHealth(
                            ident.slice, ident.host, ident.incarnation, kind == "pathways_healthy", msg.report.detail
                        )
                    )
                elif kind == "metadata_notice":
                    self.c.submit(_metadata_notice(ident, msg.report))
                else:
                    log.warning("unknown worker report kind ignored", kind=kind, slice=ident.slice, host=ident.host)

    async def _write(self, context: grpc.aio.ServicerContext, conn: _Conn) -> None:
        while True:
            msg = await conn.outbox.get()
            await context.write(msg)


# ---------------------------------------------------------------------------
# the TrainerLink service: the trainer hooks
# ---------------------------------------------------------------------------


class TrainerLinkService(trainer_pb2_grpc.TrainerLinkServicer):
    def __init__(self, coord: Coordinator) -> None:
        self.c = coord

    async def Attach(
        self, request_iterator: AsyncIterator[trainer_pb2.TrainerMessage], context: grpc.aio.ServicerContext
    ) -> None:  # noqa: N802
        first = await context.read()
        if first is grpc.aio.EOF or not first.HasField("hello"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message on Attach must be a TrainerHello")
            return
        hello = first.hello
        if hello.job and hello.job != self.c.cfg.job:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {hello.job!r} is not this coordinator's job {self.c.cfg.job!r}",
            )
            return
        conn = _Conn()
        old = self.c.trainer
        self.c.trainer = conn
        if old is not None:
            old.closed.set()
        settings = None
        if hello.has_elastic_settings:
            settings = TrainerSettings(
                hello.elastic_min_slice_count, hello.elastic_timeout_seconds, hello.elastic_max_retries
            )
        self.c.submit(TrainerAttached(hello.generation, hello.step_in_memory, frozenset(hello.active_slices), settings))
        reader = asyncio.create_task(self._read(context))
        writer = asyncio.create_task(self._write(context, conn))
        try:
            await asyncio.wait(
                {reader, writer, asyncio.create_task(conn.closed.wait())}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            reader.cancel()
            writer.cancel()
            if self.c.trainer is conn:
                self.c.trainer = None
                self.c.submit(TrainerDetached())

    async def _read(self, context: grpc.aio.ServicerContext) -> None:
        while True:
            try:
                msg = await context.read()
            except grpc.aio.AioRpcError:
                return
            if msg is grpc.aio.EOF:
                return
            ev = _trainer_event(msg)
            if ev is not None:
                self.c.submit(ev)

    async def _write(self, context: grpc.aio.ServicerContext, conn: _Conn) -> None:
        while True:
            cmd = await conn.outbox.get()
            await context.write(cmd)


def _trainer_event(msg: trainer_pb2.TrainerMessage) -> Event | None:
    match msg.WhichOneof("msg"):
        case "step":
            return TrainerStepped(msg.step.step, msg.step.generation, msg.step.step_seconds)
        case "slice_error":
            e = msg.slice_error
            return TrainerSliceError(frozenset(e.slices), e.message, e.step, e.generation)
        case "held":
            h = msg.held
            return TrainerHeld(h.generation, h.step, h.committed_step, h.flush_seconds, h.flush_bytes)
        case "resumed":
            r = msg.resumed
            return TrainerResumed(r.generation, r.step, frozenset(r.active_slices), r.restored_from)
        case "flushed":
            f = msg.flushed
            return TrainerFlushed(f.generation, f.committed_step, f.flush_seconds, f.flush_bytes)
        case "finished":
            return TrainerFinished(msg.finished.step)
    log.warning("unexpected trainer message ignored", kind=msg.WhichOneof("msg"))
    return None


async def serve(cfg: CoordinatorConfig) -> int:
    logmod.configure(cfg.log_format, cfg.log_level, jobset=cfg.job, role="coordinator")
    return await Coordinator(cfg).run()


def _metadata_notice(ident: peer_pb2.HostIdentity, report: peer_pb2.LocalReport) -> NodeNotice:
    """A worker's metadata server announced (or cleared) a disruption of its own host."""
    key, _, value = report.detail.partition("=")
    cleared = value in ("NONE", "FALSE")
    left = report.deadline_unix - time.time() if report.deadline_unix else None
    # The node label cloud.google.com/scheduled-maintenance-time names a window's start: plan the
    # drain for it (agent.sources.node_pool) instead of draining now.
    scheduled = key == "node/scheduled-maintenance-time" and left is not None and not cleared
    return NodeNotice(
        kind=key.rsplit("/", 1)[-1] + ("" if value.isdigit() else f":{value}"),  # no timestamps in metric labels
        source="metadata",
        node=ident.node,
        slice=ident.slice,
        deadline=None if left is None else time.monotonic() + left,
        event_time=report.event_time_unix or None,
        cleared=cleared,
        reason=f"{'node' if key.startswith('node/') else 'metadata server'} "
        f"{ident.node or f'host {ident.slice}.{ident.host}'}: {key} = {value}",
        starts_at=time.monotonic() + left if scheduled and left is not None else None,
    )
