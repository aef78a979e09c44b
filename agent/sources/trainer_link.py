"""The TrainerLink service: the trainer hooks attach here, one link per JAX process, and this source
turns their messages (steps, slice errors, acknowledgements) into core events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc

from agent import log as logmod
from agent.core.model import (
    Event,
    TrainerAttached,
    TrainerFinished,
    TrainerFlushed,
    TrainerHeld,
    TrainerResumed,
    TrainerSettings,
    TrainerSliceError,
    TrainerStepped,
)
from agent.links import Link, Refused
from protos.elastic_sidecar.v1 import trainer_pb2, trainer_pb2_grpc

if TYPE_CHECKING:
    from agent.coordinator import Coordinator

log = logmod.get("coordinator")
TRAINER_SERVICE = trainer_pb2.DESCRIPTOR.services_by_name["TrainerLink"].full_name


class TrainerLinkService(trainer_pb2_grpc.TrainerLinkServicer):
    """Trainer processes' links; :class:`agent.trainer_group.TrainerGroup` presents them to the core as one."""

    def __init__(self, coord: Coordinator) -> None:
        self.c = coord

    async def Attach(
        self, request_iterator: AsyncIterator[trainer_pb2.TrainerMessage], context: grpc.aio.ServicerContext
    ) -> None:  # noqa: N802
        try:
            hello = await self._hello(context)
            await self._admit(hello, context.peer())
        except Refused as r:
            await context.abort(r.code, r.message)
            return
        index = hello.process_index
        conn = Link(who=f"{hello.host or 'trainer'} at {context.peer()}")
        # Claimed before any await, so a second link admitted meanwhile cannot pass the same check.
        self.c.trainer_conns[index] = conn
        try:
            # Headers now: the trainer counts its link as up once the sidecar has accepted it.
            await context.send_initial_metadata(())
        except BaseException:
            if self.c.trainer_conns.get(index) is conn:
                del self.c.trainer_conns[index]
            raise
        self._attached(hello)
        reader = asyncio.create_task(self._read(context, index))
        writer = asyncio.create_task(self._write(context, conn))
        closer = asyncio.create_task(conn.closed.wait())
        try:
            await asyncio.wait({reader, writer, closer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            reader.cancel()
            writer.cancel()
            closer.cancel()
            self._detached(index, conn)

    async def _hello(self, context: grpc.aio.ServicerContext) -> trainer_pb2.TrainerHello:
        """The link's first message, which must be a TrainerHello for this job."""
        first = await context.read()
        if first is grpc.aio.EOF or not first.HasField("hello"):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "the first message on Attach must be a TrainerHello")
        hello = first.hello
        if hello.job and hello.job != self.c.cfg.job:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {hello.job!r} is not this coordinator's job {self.c.cfg.job!r}",
            )
        return hello

    async def _admit(self, hello: trainer_pb2.TrainerHello, peer: str) -> None:
        """Fencing first, then the process's place in the group, then one live link per process."""
        c = self.c
        if hello.epoch > c.epoch:
            await c.epoch_claim(hello.epoch, hello.epoch_coordinator, hello.epoch_proof, "the trainer")
        if c.fenced_by:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this coordinator (epoch {c.epoch}) was superseded by epoch {c.fenced_by}",
            )
        index = hello.process_index
        refused = c.group.check_hello(index, hello.process_count)
        if refused:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, refused)
        old = c.trainer_conns.get(index)
        if old is not None and not old.closed.is_set():
            # One trainer process, one link. A second live link for it is a second trainer for this job (two
            # launches, a stale pod): letting each replace the other had them evict each other in a loop.
            # The link that is live keeps the job; a restarted trainer's old link is gone first (its process
            # ended, the stream with it; the transport keepalive finds a silent one), so its new one gets in.
            c.metrics.duplicate_trainer_links.inc()
            why = (
                f"a trainer link for process {index} of job {c.cfg.job!r} is already attached "
                f"({old.who or '?'}); this second one ({peer}) is refused: is a second trainer running "
                "against this sidecar?"
            )
            log.warning("second trainer link refused", process_index=index, live=old.who, refused=peer)
            raise Refused(grpc.StatusCode.ALREADY_EXISTS, why)

    def _attached(self, hello: trainer_pb2.TrainerHello) -> None:
        """Tell the core (through the group, which waits for every process of a multi-controller job)."""
        group = self.c.group
        index = hello.process_index
        settings = None
        if hello.has_elastic_settings:
            settings = TrainerSettings(
                hello.elastic_min_slice_count, hello.elastic_timeout_seconds, hello.elastic_max_retries
            )
        attached = TrainerAttached(
            hello.generation,
            hello.step_in_memory,
            frozenset(hello.active_slices),
            settings,
            committed_step=hello.committed_step if hello.HasField("committed_step") else -1,
            held=hello.held,
        )
        if not group.single:
            log.info(
                "trainer process attached",
                process_index=index,
                process_count=hello.process_count,
                trainer_host=hello.host,
                generation=hello.generation,
                step=hello.step_in_memory,
                attached=sorted(self.c.trainer_conns),
            )
        for ev in group.attached(index, attached, hello.host):
            self.c.submit(ev)

    def _detached(self, index: int, conn: Link) -> None:
        c = self.c
        if c.trainer_conns.get(index) is not conn:
            return
        del c.trainer_conns[index]
        if not c.group.single:
            log.warning("trainer process link closed", process_index=index, attached=sorted(c.trainer_conns))
        for ev in c.group.detached(index):
            c.submit(ev)

    async def _read(self, context: grpc.aio.ServicerContext, index: int) -> None:
        while True:
            try:
                msg = await context.read()
            except grpc.aio.AioRpcError:
                return
            if msg is grpc.aio.EOF:
                return
            ev = _trainer_event(msg)
            if ev is not None:
                for out in self.c.group.message(index, ev):
                    self.c.submit(out)

    async def _write(self, context: grpc.aio.ServicerContext, conn: Link) -> None:
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
            return TrainerHeld(h.generation, h.step, h.committed_step, h.flush_seconds, h.flush_bytes, h.flush_error)
        case "resumed":
            r = msg.resumed
            return TrainerResumed(r.generation, r.step, frozenset(r.active_slices), r.restored_from)
        case "flushed":
            f = msg.flushed
            return TrainerFlushed(f.generation, f.committed_step, f.flush_seconds, f.flush_bytes, f.flush_error)
        case "finished":
            return TrainerFinished(msg.finished.step)
    log.warning("unexpected trainer message ignored", kind=msg.WhichOneof("msg"))
    return None
