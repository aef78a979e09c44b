"""Fencing that cannot be forged or misfire (agent.durable.fencing): real coordinators on loopback.

A claimed newer epoch fences a coordinator only with a proof it can verify; a blind start (no
state file) moves above a verified epoch instead of being fenced by its own workers; a fenced
coordinator is NOT_SERVING on gRPC health; epochs rest on the state file, not the wall clock.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent.auth import BearerToken
from agent.config import CoordinatorConfig
from agent.coordinator import Coordinator
from agent.core.model import Policy
from agent.durable import fencing
from agent.servers.status import coordinator_readiness
from protos.elastic_sidecar.v1 import peer_pb2, peer_pb2_grpc, trainer_pb2, trainer_pb2_grpc
from tests.agent.coordinators import coordinator_config

JOB = "fence-job"
TOKEN = BearerToken("peer-secret-0123456789", "test")


def config(state_dir: Path, **kw: object) -> CoordinatorConfig:
    args: dict = dict(state_file=state_dir / "state.json", state_dir=state_dir, peer_token=TOKEN)
    args.update(kw)
    policy = args.pop("policy", Policy(num_slices=2, rejoin_grace_seconds=10.0, settle_seconds=0.0))
    return coordinator_config(JOB, policy, **args)


async def started(state_dir: Path, *, with_state: bool = True, **kw: object) -> Coordinator:
    """A coordinator; ``with_state``: an earlier one left a state file (it is not blind)."""
    if with_state:
        first = Coordinator(config(state_dir, **kw))
        await first.start()
        await first.stop(grace=0.1)
    coord = Coordinator(config(state_dir, **kw))
    await coord.start()
    return coord


async def join(coord: Coordinator, epoch_seen: int, who: str = "", proof: bytes = b"") -> peer_pb2.CoordinatorMessage:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{coord.port}") as ch:
        call = peer_pb2_grpc.PeerStub(ch).Join(metadata=TOKEN.metadata())
        ident = peer_pb2.HostIdentity(slice=0, host=0, incarnation="w-1")
        reg = peer_pb2.Register(
            identity=ident, job=JOB, epoch_seen=epoch_seen, epoch_seen_coordinator=who, epoch_seen_proof=proof
        )
        await call.write(peer_pb2.WorkerMessage(register=reg))
        first = await call.read()
        call.cancel()
        return first


async def health(coord: Coordinator) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{coord.port}") as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        return resp.status


def test_a_proof_verifies_only_for_its_job_epoch_coordinator_and_key() -> None:
    p = fencing.proof(TOKEN, JOB, 42, "c1")
    assert fencing.verify(TOKEN, JOB, 42, "c1", p)
    assert not fencing.verify(TOKEN, JOB, 43, "c1", p)
    assert not fencing.verify(TOKEN, "other-job", 42, "c1", p)
    assert not fencing.verify(TOKEN, JOB, 42, "c2", p)
    assert not fencing.verify(BearerToken("another-secret", "x"), JOB, 42, "c1", p)
    assert not fencing.verify(TOKEN, JOB, 42, "c1", b"")


def test_a_new_epoch_rests_on_the_state_file_and_the_wall_clock_only_without_one() -> None:
    assert fencing.next_epoch(7, wall_ms=10**13) == 8  # a clock far ahead plays no part
    assert fencing.next_epoch(7, seen=20, wall_ms=10**13) == 21
    assert fencing.next_epoch(None, wall_ms=1000) == 1000  # blind: the clock is the floor
    assert fencing.next_epoch(None, seen=5000, wall_ms=1000) == 5001  # never below what was seen


def test_an_epoch_claim_is_older_unproven_moves_a_blind_start_or_fences() -> None:
    e = fencing.Epoch(TOKEN, JOB)
    e.take(10)
    assert fencing.verify(TOKEN, JOB, 10, e.coordinator_id, e.proof)
    assert e.claim(10, "c-other", fencing.proof(TOKEN, JOB, 10, "c-other")) == "older"
    previous = 10**15  # above any wall-clock floor (milliseconds)
    assert e.claim(previous, "c-other", b"x" * 32) == "unproven" and e.claims_ignored == 1
    # Blind and not yet steered: it takes the next epoch above the verified one.
    assert e.claim(previous, "c-other", fencing.proof(TOKEN, JOB, previous, "c-other")) == "moved"
    assert e.epoch == previous + 1 and fencing.verify(TOKEN, JOB, previous + 1, e.coordinator_id, e.proof)
    e.steered = True
    newer = previous + 50
    assert e.claim(newer, "c-newer", fencing.proof(TOKEN, JOB, newer, "c-newer")) == "fenced"
    assert e.epoch == previous + 1 and e.fenced_by == 0  # the caller fences
    restored = fencing.Epoch(TOKEN, JOB)
    restored.blind = False  # its epoch came from a state file: a newer one fences it
    restored.take(10)
    assert restored.claim(20, "c-newer", fencing.proof(TOKEN, JOB, 20, "c-newer")) == "fenced"


async def test_a_forged_epoch_claim_is_ignored_and_the_coordinator_keeps_serving(tmp_path: Path) -> None:
    coord = await started(tmp_path / "state")
    try:
        for who, proof in (("", b""), ("someone", b"x" * 32), ("someone", fencing.proof(None, JOB, 2**62, "x"))):
            first = await join(coord, 2**62, who, proof)
            assert first.HasField("registered") and first.registered.epoch == coord.epoch
        assert coord.fenced_by == 0 and coordinator_readiness(coord)["not_fenced"]
        assert await health(coord) == health_pb2.HealthCheckResponse.SERVING
        # The worker got this coordinator's own proof, which verifies.
        r = first.registered
        assert fencing.verify(TOKEN, JOB, r.epoch, r.epoch_coordinator, r.epoch_proof)
        # A trainer hello with an unproven epoch is ignored as well.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{coord.trainer_port}") as ch:
            call = trainer_pb2_grpc.TrainerLinkStub(ch).Attach()
            await call.write(trainer_pb2.TrainerMessage(hello=trainer_pb2.TrainerHello(job=JOB, epoch=2**62)))
            await asyncio.wait_for(call.initial_metadata(), 5)
            call.cancel()
        assert coord.fenced_by == 0
    finally:
        await coord.stop(grace=0.1)


async def test_a_verified_newer_epoch_fences_and_health_says_not_serving(tmp_path: Path) -> None:
    coord = await started(tmp_path / "state")
    newer = coord.epoch + 5
    try:
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await join(coord, newer, "c-newer", fencing.proof(TOKEN, JOB, newer, "c-newer"))
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"superseded by epoch {newer}" in (ei.value.details() or "")
        assert coord.fenced_by == newer and coordinator_readiness(coord)["not_fenced"] is False
        for _ in range(50):
            if await health(coord) == health_pb2.HealthCheckResponse.NOT_SERVING:
                break
            await asyncio.sleep(0.05)
        assert await health(coord) == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        await coord.stop(grace=0.1)


async def test_a_blind_start_behind_the_last_epoch_moves_above_it_instead_of_being_fenced(tmp_path: Path) -> None:
    # No state file and a wall clock behind the previous coordinator's: its workers present the
    # previous (verified) epoch, which is above the wall-clock floor this one took.
    coord = await started(tmp_path / "state", with_state=False)
    previous = coord.epoch + 60_000
    try:
        first = await join(coord, previous, "c-previous", fencing.proof(TOKEN, JOB, previous, "c-previous"))
        assert first.HasField("registered") and coord.fenced_by == 0
        assert coord.epoch == previous + 1 == first.registered.epoch
        r = first.registered
        assert fencing.verify(TOKEN, JOB, r.epoch, r.epoch_coordinator, r.epoch_proof)
        assert json.loads((tmp_path / "state" / "state.json").read_text())["epoch"] == previous + 1  # durable
    finally:
        await coord.stop(grace=0.1)


async def test_a_worker_refused_by_a_superseded_coordinator_keeps_looking(tmp_path: Path) -> None:
    from agent.config import WorkerConfig
    from agent.worker import Worker

    coord = await started(tmp_path / "state")
    newer = coord.epoch + 5
    await coord.epoch_claim(newer, "c-newer", fencing.proof(TOKEN, JOB, newer, "c-newer"), "test")
    assert coord.fenced_by == newer
    worker = Worker(
        WorkerConfig(
            job=JOB,
            coordinator=f"127.0.0.1:{coord.port}",
            slice=0,
            host=0,
            node="n0",
            node_pool="",
            pod="p0",
            health_target=None,
            health_check="grpc",
            log_format="json",
            log_level="warning",
            peer_token=TOKEN,
        )
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker._run(stop))  # noqa: SLF001
    try:
        await asyncio.sleep(2.5)
        assert not task.done(), f"the worker gave up (exit {task.result() if task.done() else None})"
        assert not worker.registered.is_set()  # refused each time, never registered with the superseded one
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 10) == 0
        await coord.stop(grace=0.1)
