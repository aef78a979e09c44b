"""The worker sidecar: one beside every TPU host.

It watches the local Pathways worker (a pluggable health checker), registers
with the coordinator once that worker serves, and keeps one stream open that
carries heartbeats and health changes. If the stream breaks (coordinator
restart) it reconnects with backoff, keeping its incarnation so the
coordinator knows it is the same process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import grpc

from agent import constants as C
from agent import log as logmod
from agent.config import WorkerConfig
from agent.sources.health import HealthChecker
from agent.sources.metadata import PREEMPTED_KEY, MetadataChange, MetadataWatcher
from protos.elastic_sidecar.v1 import peer_pb2, peer_pb2_grpc

log = logmod.get("worker")


class Worker:
    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.incarnation = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.healthy = cfg.health_target is None
        self._health_changed = asyncio.Event()
        self.registered = asyncio.Event()
        self.generation = 0
        self._stopping = False
        self.notices: dict[str, peer_pb2.LocalReport] = {}
        """Latest metadata-server value per key; re-sent on every new stream."""
        self._unsent: set[str] = set()

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
        log.warning("metadata server notice", key=change.key, value=change.value)

    def _on_health(self, healthy: bool, detail: str) -> None:
        self.healthy = healthy
        self._health_changed.set()
        log.info("local health changed", healthy=healthy, detail=detail)

    def _identity(self) -> peer_pb2.HostIdentity:
        c = self.cfg
        return peer_pb2.HostIdentity(
            slice=c.slice, host=c.host, node=c.node, node_pool=c.node_pool, pod=c.pod, incarnation=self.incarnation
        )

    async def _session(self) -> None:
        """One Join stream, until it breaks."""
        async with grpc.aio.insecure_channel(self.cfg.coordinator, options=list(C.GRPC_KEEPALIVE_OPTIONS)) as ch:
            call = peer_pb2_grpc.PeerStub(ch).Join()
            await call.write(
                peer_pb2.WorkerMessage(register=peer_pb2.Register(identity=self._identity(), job=self.cfg.job))
            )
            first = await call.read()
            if first is grpc.aio.EOF or not first.HasField("registered"):
                raise ConnectionError("coordinator closed the stream before acknowledging the registration")
            interval = first.registered.heartbeat_interval_seconds or C.HEARTBEAT_INTERVAL_SECONDS
            self.generation = first.registered.generation
            self.registered.set()
            log.info("registered with coordinator", coordinator=self.cfg.coordinator, generation=self.generation)
            reader = asyncio.create_task(self._read(call))
            try:
                seq = 0
                # The coordinator records a registered host as healthy; a change since the
                # Register went out (the local worker died meanwhile) must still be reported.
                reported = True
                self._unsent = {k for k, r in self.notices.items() if r.deadline_unix}
                while not reader.done():
                    for key in sorted(self._unsent):
                        self._unsent.discard(key)
                        await call.write(peer_pb2.WorkerMessage(report=self.notices[key]))
                    if self.healthy != reported:
                        reported = self.healthy
                        kind = "pathways_healthy" if reported else "pathways_unhealthy"
                        await call.write(
                            peer_pb2.WorkerMessage(
                                report=peer_pb2.LocalReport(kind=kind, detail=self.cfg.health_target or "")
                            )
                        )
                    seq += 1
                    await call.write(
                        peer_pb2.WorkerMessage(heartbeat=peer_pb2.Heartbeat(seq=seq, local_healthy=self.healthy))
                    )
                    self._health_changed.clear()
                    try:
                        await asyncio.wait_for(self._health_changed.wait(), interval)
                    except TimeoutError:
                        pass
                if self._stopping:
                    return
                reader.result()
            finally:
                self.registered.clear()
                reader.cancel()
                if self._stopping:
                    await call.done_writing()

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                raise ConnectionError("coordinator ended the stream")
            if msg.HasField("command"):
                cmd = msg.command
                if cmd.generation >= self.generation:
                    self.generation = cmd.generation
                    log.info("coordinator command", kind=cmd.kind, generation=cmd.generation, reason=cmd.reason)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        checker_task = None
        if self.cfg.health_target:
            checker = HealthChecker.create(self.cfg.health_check, self.cfg.health_target, self._on_health)
            checker_task = asyncio.create_task(checker.run())
        metadata_task = None
        if self.cfg.metadata_url:
            watcher = MetadataWatcher(self.cfg.metadata_url, self._on_metadata)
            metadata_task = asyncio.create_task(watcher.run())
        delay = 0.05
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
                delay = 0.05
            except (grpc.aio.AioRpcError, ConnectionError) as e:
                detail = e.details() if isinstance(e, grpc.aio.AioRpcError) else str(e)
                code = e.code() if isinstance(e, grpc.aio.AioRpcError) else None
                if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                    log.error("coordinator refused this worker", detail=detail)
                    return C.EXIT_USAGE
                log.warning("coordinator link lost; reconnecting", detail=detail, retry_in=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        for task in (checker_task, metadata_task):
            if task is not None:
                task.cancel()
        log.info("worker stopping")
        return C.EXIT_OK


async def serve(cfg: WorkerConfig) -> int:
    logmod.configure(cfg.log_format, cfg.log_level, jobset=cfg.job, role="worker", slice=cfg.slice, host=cfg.host)
    return await Worker(cfg).run()
