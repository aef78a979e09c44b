"""The worker sidecar: one beside every TPU host.

It watches the local Pathways worker (a pluggable health checker), registers
with the coordinator once that worker serves, and keeps one stream open that
carries health changes and notices, and its heartbeats until the coordinator
confirms it receives them as UDP datagrams (then only datagrams carry them:
:mod:`agent.sources.heartbeat_datagrams`). If the stream breaks (coordinator
restart) it reconnects with backoff, keeping its incarnation so the
coordinator knows it is the same process.

It presents the peer token on Join when ``--peer-token-file`` is given. Its
own HTTP server (``--http-listen``) reports liveness, readiness (registered
with the coordinator), metrics and a status page; an optional read-only admin
API (``--admin-listen``) serves GetStatus and WatchEvents of its local events.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time
import uuid
from typing import Any

import grpc

from agent import constants as C
from agent import log as logmod
from agent.config import WorkerConfig
from agent.durable import fencing
from agent.metrics import WorkerMetrics
from agent.servers.feed import EventFeed
from agent.sources.health import HealthChecker
from agent.sources.heartbeat_datagrams import DatagramSender, command_position
from agent.sources.metadata import PREEMPTED_KEY, MetadataChange, MetadataWatcher
from agent.sources.tpu_metrics import MetricsSource
from agent.stragglers.reporter import WindowReporter
from protos.elastic_sidecar.v1 import peer_pb2, peer_pb2_grpc

log = logmod.get("worker")
SUPERSEDED_RETRY_MAX_SECONDS = 5.0
"""Longest wait between tries while only a superseded coordinator answers."""
DUPLICATE_RETRY_MAX_SECONDS = 10.0
"""Longest wait between tries while another live sidecar speaks for this host: this one stands by, and
takes over only once the other's stream has ended."""
HEALTH_STABLE_SECONDS = 1.0
"""How long a local worker must stay healthy after a failure before it counts again."""
WINDOWS_QUEUED = 2
"""Metrics windows kept for the stream while it is down: older ones are stale for the detector."""


class Worker:
    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.incarnation = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.healthy = cfg.health_target is None
        self._health_changed = asyncio.Event()
        self.registered = asyncio.Event()
        self.generation = 0
        self.epoch_seen = 0
        """Newest coordinator epoch this worker accepted (fencing: older ones are refused)."""
        self.epoch_coordinator = ""
        self.epoch_proof = b""
        """Who issued :attr:`epoch_seen` and its proof (:mod:`agent.durable.fencing`), presented on Join."""
        self._stopping = False
        self._misdirected = False
        """A Join answered UNIMPLEMENTED (--coordinator names the wrong port) was already reported."""
        self._link_warnings = logmod.Backoff()
        """When a lost link's WARNING is due: the reconnects keep their pace, their warnings thin out."""
        self._was_unhealthy = False
        self._recovery: asyncio.TimerHandle | None = None
        self.notices: dict[str, peer_pb2.LocalReport] = {}
        """Latest metadata-server value per key; re-sent on every new stream."""
        self._unsent: set[str] = set()
        self.metrics = WorkerMetrics()
        self.metrics.local_healthy.set(1 if self.healthy else 0)
        self.feed = EventFeed()
        """Local events (health, registration, commands, notices) for WatchEvents and the status page."""
        self.last_reason = ""
        self.admin: Any = None
        self.http: Any = None
        self.node_pool = cfg.node_pool
        """The node's GKE node pool: the flag, or what :meth:`learn_node_pool` found."""
        self.datagrams: DatagramSender | None = None
        """Heartbeat datagrams to the coordinator, when it offers them (this stream's registration)."""
        self._last_command: tuple[int, int] = (-1, 0)
        """(generation, COMMAND_ORDER) of the newest coordinator command acted on."""
        self.windows: collections.deque[peer_pb2.MetricsWindow] = collections.deque(maxlen=WINDOWS_QUEUED)
        """The host's libtpu metrics windows not yet on the stream (agent.stragglers.reporter)."""

    def _note(self, trigger: str, reason: str) -> None:
        """Record a local event for the read-only admin API and the status page."""
        self.last_reason = reason
        state = "registered" if self.registered.is_set() else "connecting"
        self.feed.publish(
            {
                "time": time.time(),
                "trigger": trigger,
                "reason": reason,
                "phase": state if self.healthy else "local worker unhealthy",
                "generation": self.generation,
                "active_slices": [],
                "actions": [],
            }
        )

    def readiness(self) -> dict[str, bool]:
        """What /readyz checks: registered with the coordinator."""
        return {"registered": self.registered.is_set()}

    def _on_metadata(self, change: MetadataChange) -> None:
        clear = change.value in ("NONE", "FALSE")
        notice = (
            self.cfg.preemption_notice_seconds if change.key == PREEMPTED_KEY else self.cfg.maintenance_notice_seconds
        )
        now = time.time()
        self.notices[change.key] = peer_pb2.LocalReport(
            kind="metadata_notice",
            detail=f"{change.key}={change.value}",
            deadline_unix=0.0 if clear else now + notice,
            event_time_unix=now,
        )
        self._unsent.add(change.key)
        self._health_changed.set()
        self.metrics.notices.labels(change.key.rsplit("/", 1)[-1]).inc()
        log.warning("metadata server notice", key=change.key, value=change.value)
        self._note("MetadataNotice", f"metadata server: {change.key} = {change.value}")

    def _on_node_signal(self, sig: Any) -> None:
        """A GKE maintenance label or taint on this node changed (:class:`agent.sources.node_pool.NodeSignal`).

        Reported like a metadata-server notice; the coordinator plans a drain for a scheduled
        time (the label) and drains at once for the taints.
        """
        clear = sig.value in ("NONE", "FALSE")
        now = time.time()
        self.notices[sig.key] = peer_pb2.LocalReport(
            kind="metadata_notice",
            detail=f"{sig.key}={sig.value}",
            deadline_unix=0.0 if clear else (sig.starts_unix or now + self.cfg.maintenance_notice_seconds),
            event_time_unix=now,
        )
        self._unsent.add(sig.key)
        self._health_changed.set()
        self.metrics.notices.labels(sig.key.rsplit("/", 1)[-1]).inc()
        log.info("node maintenance signal", key=sig.key, value=sig.value)
        self._note("NodeSignal", f"node {self.cfg.node}: {sig.key} = {sig.value}")

    def _on_health(self, healthy: bool, detail: str) -> None:
        """A checker's verdict. Going unhealthy is reported at once; coming back
        after a failure only once it has held for ``HEALTH_STABLE_SECONDS``, so a
        flapping Pathways worker does not make the job shrink and grow in a loop."""
        if self._recovery is not None:
            self._recovery.cancel()
            self._recovery = None
        if healthy and self._was_unhealthy:
            self._recovery = asyncio.get_running_loop().call_later(
                HEALTH_STABLE_SECONDS, self._set_health, True, f"{detail} (stable for {HEALTH_STABLE_SECONDS:g} s)"
            )
            return
        self._was_unhealthy = self._was_unhealthy or not healthy
        self._set_health(healthy, detail)

    def _set_health(self, healthy: bool, detail: str) -> None:
        self._recovery = None
        self.healthy = healthy
        self._health_changed.set()
        self.metrics.local_healthy.set(1 if healthy else 0)
        log.info("local health changed", healthy=healthy, detail=detail)
        self._note("LocalHealth", f"local Pathways worker {'healthy' if healthy else 'unhealthy'}: {detail}")

    def _identity(self) -> peer_pb2.HostIdentity:
        c = self.cfg
        return peer_pb2.HostIdentity(
            slice=c.slice, host=c.host, node=c.node, node_pool=self.node_pool, pod=c.pod, incarnation=self.incarnation
        )

    async def _session(self) -> None:
        """One Join stream, until it breaks."""
        async with grpc.aio.insecure_channel(self.cfg.coordinator, options=list(C.PEER_KEEPALIVE_OPTIONS)) as ch:
            token = self.cfg.peer_token
            call = peer_pb2_grpc.PeerStub(ch).Join(metadata=token.metadata() if token is not None else None)
            await _write_or_raise_status(call, self._register_message())
            first = await call.read()
            if first is grpc.aio.EOF or not first.HasField("registered"):
                raise ConnectionError("coordinator closed the stream before acknowledging the registration")
            interval = await self._accept(first.registered)
            self.registered.set()
            self.metrics.connected.set(1)
            self.metrics.generation.set(self.generation)
            log.info("registered with coordinator", coordinator=self.cfg.coordinator, generation=self.generation)
            self._note("Registered", f"registered with the coordinator at {self.cfg.coordinator}")
            reader = asyncio.create_task(self._read(call))
            try:
                await self._report(call, reader, interval)
                if self._stopping:
                    return
                reader.result()
            finally:
                self.registered.clear()
                self.metrics.connected.set(0)
                if self.datagrams is not None:
                    self.datagrams.close()
                    self.datagrams = None
                reader.cancel()
                if self._stopping:
                    await call.done_writing()

    def _register_message(self) -> peer_pb2.WorkerMessage:
        c = self.cfg
        return peer_pb2.WorkerMessage(
            register=peer_pb2.Register(
                identity=self._identity(),
                job=c.job,
                epoch_seen=self.epoch_seen,
                epoch_seen_coordinator=self.epoch_coordinator,
                epoch_seen_proof=self.epoch_proof,
                generation_seen=self.generation,
                local_healthy=self.healthy and not self._was_unhealthy,
                health_address=c.health_target or "",
                health_check=c.health_check if c.health_target else "",
            )
        )

    async def _accept(self, reg: peer_pb2.Registered) -> float:
        """Follow the coordinator that registered this worker (unless it is older than one already
        followed); returns the heartbeat interval it asks for."""
        c = self.cfg
        if reg.epoch < self.epoch_seen:
            # An older coordinator than one this worker already followed: it may
            # not steer. Try again; the newer one (or a fresh start) will answer.
            raise ConnectionError(f"coordinator epoch {reg.epoch} is older than epoch {self.epoch_seen} already seen")
        if reg.epoch > self.epoch_seen:
            if fencing.verify(c.peer_token, c.job, reg.epoch, reg.epoch_coordinator, reg.epoch_proof):
                self.epoch_seen = reg.epoch
                self.epoch_coordinator, self.epoch_proof = reg.epoch_coordinator, reg.epoch_proof
            else:
                # Still follow it (the stream is the one this worker was pointed at), but a claim
                # it could not prove is not one to present to other coordinators.
                log.warning("coordinator epoch came without a valid proof; not kept", epoch=reg.epoch)
        interval = reg.heartbeat_interval_seconds or C.HEARTBEAT_INTERVAL_SECONDS
        self.generation = reg.generation
        self._last_command = (-1, 0)  # a new registration: the old one's datagrams no longer authenticate
        self.datagrams = await DatagramSender.create(
            c.coordinator,
            reg.heartbeat_datagram_port,
            reg.heartbeat_datagram_token,
            c.slice,
            c.host,
            on_command=lambda cmd: self._on_command(cmd, "datagram"),
        )
        return interval

    async def _report(self, call: grpc.aio.StreamStreamCall, reader: asyncio.Task[None], interval: float) -> None:
        """Notices, health changes and heartbeats, until the stream's reader ends."""
        seq = 0
        # The coordinator records a registered host as healthy; a change since the
        # Register went out (the local worker died meanwhile) must still be reported.
        reported = True
        self._unsent = {k for k, r in self.notices.items() if r.deadline_unix}
        while not reader.done():
            while self.windows:
                await call.write(peer_pb2.WorkerMessage(metrics_window=self.windows.popleft()))
            for key in sorted(self._unsent):
                self._unsent.discard(key)
                await call.write(peer_pb2.WorkerMessage(report=self.notices[key]))
            if self.healthy != reported:
                reported = self.healthy
                kind = "pathways_healthy" if reported else "pathways_unhealthy"
                await call.write(
                    peer_pb2.WorkerMessage(report=peer_pb2.LocalReport(kind=kind, detail=self.cfg.health_target or ""))
                )
            seq += 1
            # A datagram alone once the coordinator has received one; on the stream until then.
            dg = self.datagrams
            if not (dg is not None and dg.send() and dg.confirmed):
                await call.write(
                    peer_pb2.WorkerMessage(heartbeat=peer_pb2.Heartbeat(seq=seq, local_healthy=self.healthy))
                )
            self._health_changed.clear()
            try:
                await asyncio.wait_for(self._health_changed.wait(), interval)
            except TimeoutError:
                pass

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                raise ConnectionError("coordinator ended the stream")
            if msg.HasField("datagrams_received"):
                if self.datagrams is not None and not self.datagrams.confirmed:
                    self.datagrams.confirmed = True
                    log.info("coordinator receives heartbeat datagrams; heartbeats leave the stream")
                continue
            if msg.HasField("command"):
                self._on_command(msg.command, "stream")

    def _on_command(self, cmd: peer_pb2.PeerCommand, via: str) -> None:
        """A coordinator command, from the stream or as a datagram: whichever copy comes first counts."""
        if cmd.epoch < self.epoch_seen:
            log.warning("command from a superseded coordinator ignored", epoch=cmd.epoch, seen=self.epoch_seen, via=via)
            return
        # Within a generation a hold comes before its resume, and an abort or the end after both
        # (agent.core.decide): a copy that is not past the last command acted on is a duplicate,
        # or a late datagram overtaken by the stream.
        order = command_position(cmd.generation, cmd.kind)
        if order <= self._last_command:
            return
        if cmd.generation >= self.generation:
            self._last_command = order
            self.generation = cmd.generation
            self.metrics.generation.set(cmd.generation)
            log.info("coordinator command", kind=cmd.kind, generation=cmd.generation, reason=cmd.reason, via=via)
            self._note("CoordinatorCommand", f"{cmd.kind} (generation {cmd.generation}): {cmd.reason}")

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await self.start_servers()
            return await self._run(stop)
        except OSError as e:
            log.error("worker could not start", error=str(e))
            return C.EXIT_USAGE
        finally:
            await self.stop_servers()

    async def start_servers(self) -> None:
        """The HTTP server and the read-only admin API, as configured."""
        cfg = self.cfg
        if cfg.http_listen is not None:
            from agent.servers.http import start_http_server
            from agent.servers.status import status_document, worker_status

            self.http = await start_http_server(
                cfg.http_listen,
                status=lambda: status_document(worker_status(self), self.feed),
                ready=self.readiness,
                registry=self.metrics.registry,
            )
        if cfg.admin_listen is not None:
            from agent.servers.admin import WorkerAdmin, start_admin_server

            self.admin = await start_admin_server(WorkerAdmin(self), cfg.admin_listen, token=None, metrics=self.metrics)

    async def stop_servers(self) -> None:
        if self.http is not None:
            await self.http.stop()
            self.http = None
        if self.admin is not None:
            await self.admin.stop()
            self.admin = None

    async def learn_node_pool(self) -> None:
        """Ask the Kubernetes API for the node's pool when the flag left it empty (``--node-pool-source``)."""
        c = self.cfg
        if self.node_pool or c.node_pool_source != "kubernetes":
            return
        if not c.kubernetes_api:
            log.error(
                "--node-pool-source kubernetes needs --kubernetes-api (KUBERNETES_SERVICE_HOST is unset: not in a pod?); "
                "registering without a node pool, so node-pool notices will not reach this slice"
            )
            return
        from agent.sources.node_pool import KubernetesAPI, lookup_with_retries

        api = KubernetesAPI(c.kubernetes_api, c.kubernetes_token_file, c.kubernetes_ca_file)
        self.node_pool = await lookup_with_retries(api, c.node)

    async def _run(self, stop: asyncio.Event) -> int:
        await self.learn_node_pool()
        watchers = self._start_watchers()
        delay = 0.05
        self._misdirected = False
        while not stop.is_set():
            if not self.healthy:
                # Register only once the local Pathways worker serves.
                self._health_changed.clear()
                waiter = asyncio.create_task(self._health_changed.wait())
                await asyncio.wait({waiter, asyncio.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                continue
            session = asyncio.create_task(self._session())
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({session, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if stop.is_set():
                self._stopping = True
                session.cancel()
                break
            try:
                session.result()
            except (grpc.aio.AioRpcError, ConnectionError, asyncio.InvalidStateError) as e:
                after = await self._link_failed(e, delay)
                if after is None:
                    return C.EXIT_USAGE
                delay = after
                continue
            delay = 0.05
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        for task in watchers:
            task.cancel()
        log.info("worker stopping")
        return C.EXIT_OK

    def _start_watchers(self) -> list[asyncio.Task[None]]:
        """The local Pathways worker's health, the node's signals and the metadata server, as configured."""
        c = self.cfg
        tasks = []
        if c.health_target:
            checker = HealthChecker.create(c.health_check, c.health_target, self._on_health)
            tasks.append(asyncio.create_task(checker.run()))
        if c.node_pool_source == "kubernetes" and c.kubernetes_api and c.node_watch_seconds > 0:
            from agent.sources.node_pool import KubernetesAPI, NodeSignalWatcher

            api = KubernetesAPI(c.kubernetes_api, c.kubernetes_token_file, c.kubernetes_ca_file)
            tasks.append(
                asyncio.create_task(NodeSignalWatcher(api, c.node, self._on_node_signal, c.node_watch_seconds).run())
            )
        if c.metadata_url:
            watcher = MetadataWatcher(c.metadata_url, self._on_metadata)
            tasks.append(asyncio.create_task(watcher.run()))
        if c.tpu_metrics != "off":
            tasks.append(asyncio.create_task(self._window_reporter().run(), name="metrics-windows"))
        return tasks

    def _window_reporter(self) -> WindowReporter:
        """The host's libtpu metrics, one window per --straggler-window-seconds, onto the stream."""
        c = self.cfg
        options = {"target": c.tpu_metrics_target} if c.tpu_metrics == "service" else {}
        source = MetricsSource.create(c.tpu_metrics, **options)

        def send(msg: peer_pb2.MetricsWindow) -> None:
            self.windows.append(msg)
            self._health_changed.set()  # wakes the stream's writer (_report)

        return WindowReporter(source, c.straggler_window_seconds, send)

    async def _link_failed(self, e: Exception, delay: float) -> float | None:
        """The Join stream ended in error: wait as the cause asks and return the next delay, or None when
        the coordinator refused this worker for good (a flag to fix)."""
        # InvalidStateError: call.write on a stream the coordinator already ended
        # ("RPC already finished", e.g. a coordinator killed while starting): the link
        # is gone, as with a connection error; reconnect instead of crashing.
        detail = e.details() if isinstance(e, grpc.aio.AioRpcError) else str(e)
        code = e.code() if isinstance(e, grpc.aio.AioRpcError) else None
        ceiling = 1.0
        if code == grpc.StatusCode.FAILED_PRECONDITION and "superseded" in detail:
            # A coordinator older than one this worker (or another) followed: not this
            # worker's mistake. Keep looking, with backoff, for the current one (the
            # Service sends new connections to it once the old pod is gone).
            log.warning("coordinator refused this worker as superseded; looking again", detail=detail)
            if delay == 0.05:
                self._note("Refused", f"a superseded coordinator refused this worker: {detail}")
            ceiling = SUPERSEDED_RETRY_MAX_SECONDS
        elif code == grpc.StatusCode.ALREADY_EXISTS:
            # Another sidecar process claims this host (a stale pod beside its replacement, a manifest
            # mistake) and the coordinator lets the newer one speak for it. Not a failure of the job:
            # stand by with backoff, and take over if that one goes.
            delay = max(delay, 1.0)
            log.warning("another sidecar speaks for this host; standing by", detail=detail, retry_in=delay)
            self._note("Refused", f"another sidecar speaks for this host: {detail}")
            ceiling = DUPLICATE_RETRY_MAX_SECONDS
        elif code == grpc.StatusCode.UNIMPLEMENTED and not self._misdirected:
            # Something answers there, but not the Peer service: another port of the
            # coordinator (or another program). Say which flag to fix; keep trying.
            self._misdirected = True
            why = (
                f"--coordinator {self.cfg.coordinator} answers gRPC but does not serve worker "
                f"registrations (UNIMPLEMENTED: {detail}): set --coordinator (ES_COORDINATOR) to the "
                f"coordinator's --listen address (port {C.COORDINATOR_PORT} by default), not its "
                "--trainer-listen or --admin-listen"
            )
            log.error(why)
            self._note("Refused", why)
        elif code in (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.UNAUTHENTICATED,
        ):
            assert code is not None
            log.error("coordinator refused this worker", detail=detail, code=code.name)
            self._note("Refused", f"coordinator refused this worker ({code.name}): {detail}")
            return None
        else:
            if delay == 0.05:  # the first failure after a working link, not every retry
                self._note("LinkLost", f"coordinator link lost: {detail}")
                self._link_warnings.reset()
            self.metrics.reconnects.inc()
            if (held := self._link_warnings.due()) is not None:
                log.warning("coordinator link lost; reconnecting", detail=detail, retry_in=delay, not_logged=held)
            await asyncio.sleep(delay)
            return min(delay * 2, 1.0)
        self.metrics.reconnects.inc()
        await asyncio.sleep(delay)
        return min(delay * 2, ceiling)


async def _write_or_raise_status(call: Any, message: peer_pb2.WorkerMessage) -> None:
    """``call.write``, but a call the coordinator already ended raises that call's status.

    grpc.aio raises ``asyncio.InvalidStateError("RPC already finished.")`` for a write on a
    call that has ended (grpc/aio/_call.py ``_write``), whatever ended it. A coordinator that
    refuses the registration (a wrong peer token: UNAUTHENTICATED from the interceptor) can end
    the call before the Register is written; read as a lost link, that refusal would be retried
    instead of reported. ``read()`` on an ended call raises its status when it is not OK.
    """
    try:
        await call.write(message)
    except asyncio.InvalidStateError:
        await call.read()  # raises grpc.aio.AioRpcError with the coordinator's status when not OK
        raise


async def serve(cfg: WorkerConfig) -> int:
    logmod.configure(cfg.log_format, cfg.log_level, jobset=cfg.job, role="worker", slice=cfg.slice, host=cfg.host)
    return await Worker(cfg).run()
