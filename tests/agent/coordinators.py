"""The tests' in-process coordinator and fake trainer, one of each for every test package.

``coordinator_config`` holds the settings every in-process coordinator shares (loopback on an
ephemeral port, the shipped heartbeat timings, no state file, JSON logs); a test passes only what
it is about. ``FakeTrainer`` speaks the real TrainerLink protocol without JAX.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from agent.config import CoordinatorConfig
from agent.coordinator import Coordinator
from agent.core.model import Policy
from protos.elastic_sidecar.v1 import trainer_pb2, trainer_pb2_grpc


def coordinator_config(job: str, policy: Policy | None = None, **overrides: Any) -> CoordinatorConfig:
    """Two slices of one host unless ``policy`` says otherwise; ``overrides`` replace any field."""
    args: dict[str, Any] = dict(
        job=job,
        listen="127.0.0.1:0",
        policy=policy or Policy(num_slices=2),
        heartbeat_interval=0.25,
        heartbeat_timeout=1.2,
        state_file=None,
        journal=None,
        log_format="json",
        log_level="warning",
    )
    args.update(overrides)
    return CoordinatorConfig(**args)


def in_memory_coordinator(job: str, num_slices: int, log_level: str = "warning") -> Coordinator:
    """One host a slice, no state file."""
    return Coordinator(coordinator_config(job, Policy(num_slices=num_slices, hosts_per_slice=1), log_level=log_level))


async def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.005)


@dataclass
class FakeTrainer:
    """A trainer on the real TrainerLink that acknowledges every command at once, the way
    ``trainer_hooks`` does (hold -> HeldAck, resume -> ResumedAck, flush -> FlushedAck), so a test
    can put the coordinator into any phase in milliseconds."""

    address: str
    job: str
    step: int = 0
    answer_flush: bool = True
    commands: list[trainer_pb2.SidecarCommand] = field(default_factory=list)
    generation: int = 0
    _channel: grpc.aio.Channel | None = None
    _call: Any = None
    _task: asyncio.Task[None] | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One write at a time on the stream (gRPC refuses overlapping writes)."""

    async def _send(self, msg: trainer_pb2.TrainerMessage) -> None:
        async with self._lock:
            await self._call.write(msg)

    async def attach(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.address)
        self._call = trainer_pb2_grpc.TrainerLinkStub(self._channel).Attach()
        hello = trainer_pb2.TrainerHello(job=self.job, step_in_memory=-1, generation=self.generation)
        await self._send(trainer_pb2.TrainerMessage(hello=hello))
        self._task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            cmd = await self._call.read()
            if cmd is grpc.aio.EOF:
                return
            self.commands.append(cmd)
            kind = cmd.WhichOneof("cmd")
            body = getattr(cmd, kind)
            self.generation = max(self.generation, body.generation)
            if kind == "hold":
                ack = trainer_pb2.HeldAck(generation=body.generation, step=self.step, committed_step=self.step)
                await self._send(trainer_pb2.TrainerMessage(held=ack))
            elif kind == "resume":
                restored = "fresh" if self.step == 0 else "memory"
                ack = trainer_pb2.ResumedAck(
                    generation=body.generation, step=self.step, active_slices=body.active_slices, restored_from=restored
                )
                await self._send(trainer_pb2.TrainerMessage(resumed=ack))
            elif kind == "flush" and self.answer_flush:
                ack = trainer_pb2.FlushedAck(
                    generation=body.generation, committed_step=self.step, flush_seconds=0.01, flush_bytes=1024
                )
                await self._send(trainer_pb2.TrainerMessage(flushed=ack))

    async def advance(self, steps: int = 1) -> None:
        for _ in range(steps):
            self.step += 1
            report = trainer_pb2.StepReport(step=self.step, step_seconds=0.01, generation=self.generation)
            await self._send(trainer_pb2.TrainerMessage(step=report))

    def kinds(self) -> list[str]:
        return [c.WhichOneof("cmd") for c in self.commands]

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._call is not None:
            self._call.cancel()
        if self._channel is not None:
            await self._channel.close()
