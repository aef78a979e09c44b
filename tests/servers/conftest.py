"""Shared pieces of the server tests: an in-process coordinator with its admin and HTTP servers, and a trainer.

The trainer here speaks the real TrainerLink protocol over loopback gRPC and
acknowledges commands the way ``trainer_hooks`` does (hold -> HeldAck,
resume -> ResumedAck, flush -> FlushedAck), without JAX, so a test can put the
coordinator into any phase in milliseconds.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.auth import BearerToken, read_token_file
from agent.config import CoordinatorConfig
from agent.coordinator import Coordinator
from agent.core.model import Phase, Policy, WorkerJoined
from protos.elastic_sidecar.v1 import trainer_pb2, trainer_pb2_grpc

JOB = "servers-job"


async def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.005)


def write_token(path: Path, value: str | None = None) -> BearerToken:
    path.write_text((value or secrets.token_hex(32)) + "\n")
    return read_token_file(path, "--test-token-file")


@dataclass
class FakeTrainer:
    """A trainer on the real TrainerLink that acknowledges every command at once."""

    address: str
    job: str = JOB
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


def coordinator_config(
    num_slices: int = 4,
    *,
    admin_token: BearerToken | None = None,
    peer_token: BearerToken | None = None,
    admin: bool = True,
    http: bool = True,
    min_slices: int = 2,
    **extra: Any,
) -> CoordinatorConfig:
    return CoordinatorConfig(
        job=JOB,
        listen="127.0.0.1:0",
        policy=Policy(num_slices=num_slices, elastic_min_slice_count=min_slices, elastic_timeout_seconds=30.0),
        heartbeat_interval=0.25,
        heartbeat_timeout=1.2,
        state_file=None,
        journal=None,
        log_format="json",
        log_level="warning",
        admin_listen="127.0.0.1:0" if admin else None,
        http_listen="127.0.0.1:0" if http else None,
        admin_token=admin_token,
        peer_token=peer_token,
        **extra,
    )


@dataclass
class Job:
    """A started coordinator, its fake trainer, and the addresses of its servers."""

    coord: Coordinator
    trainer: FakeTrainer

    @property
    def admin_address(self) -> str:
        assert self.coord.admin is not None
        return f"127.0.0.1:{self.coord.admin.port}"

    @property
    def http_url(self) -> str:
        assert self.coord.http is not None
        return f"http://127.0.0.1:{self.coord.http.port}"

    def join_all(self) -> None:
        """Every host registers (as the Peer service would submit it)."""
        for s in range(self.coord.state.policy.num_slices):
            self.coord.submit(WorkerJoined(s, 0, f"inc-{s}", node=f"node-{s}", node_pool=f"pool-{s}"))

    async def running(self) -> None:
        """All slices up, the trainer attached and resumed: phase RUNNING."""
        self.join_all()
        await self.trainer.attach()
        await wait_for(
            lambda: self.coord.state.phase == Phase.RUNNING and not self.coord.state.trainer.resume_pending,
            10.0,
            "the job to start running",
        )


async def start_job(tmp_path: Path, **kw: Any) -> Job:
    coord = Coordinator(coordinator_config(**kw))
    await coord.start()
    return Job(coord, FakeTrainer(f"127.0.0.1:{coord.trainer_port}"))


@pytest.fixture
def admin_token(tmp_path: Path) -> BearerToken:
    return write_token(tmp_path / "admin-token")


@pytest.fixture
async def job(tmp_path: Path, admin_token: BearerToken) -> AsyncIterator[Job]:
    j = await start_job(tmp_path, admin_token=admin_token)
    try:
        yield j
    finally:
        await j.trainer.close()
        await j.coord.stop(grace=0.1)
