"""Shared pieces of the server tests: an in-process coordinator with its admin and HTTP servers, and
the fake trainer (tests/agent/coordinators.py) attached to it."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.auth import BearerToken, read_token_file
from agent.config import CoordinatorConfig
from agent.coordinator import Coordinator
from agent.core.model import Phase, Policy, WorkerJoined
from tests.agent.coordinators import FakeTrainer, wait_for
from tests.agent.coordinators import coordinator_config as shared_config

__all__ = ["JOB", "FakeTrainer", "Job", "coordinator_config", "start_job", "wait_for", "write_token"]

JOB = "servers-job"


def write_token(path: Path, value: str | None = None) -> BearerToken:
    path.write_text((value or secrets.token_hex(32)) + "\n")
    return read_token_file(path, "--test-token-file")


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
    return shared_config(
        JOB,
        Policy(num_slices=num_slices, elastic_min_slice_count=min_slices, elastic_timeout_seconds=30.0),
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
    return Job(coord, FakeTrainer(f"127.0.0.1:{coord.trainer_port}", JOB))


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
