"""Issue 56 with the real coordinator: two sidecars for one host, two trainer links for one job.

An in-process coordinator on loopback, worker sidecar subprocesses beside a stand-in Pathways worker,
and trainers on the real TrainerLink (the test's acknowledging fake, and ``trainer_hooks``' own link).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.core.model import HoldTrainer, Phase, TrainerAttached
from protos.elastic_sidecar.v1 import trainer_pb2
from tests.agent.coordinators import FakeTrainer
from tests.agent.test_liveness import (
    JOB,
    START_TIMEOUT,
    Observed,
    Procs,
    start_coordinator,
    start_pathways,
    wait_registered,
)
from trainer_hooks.link import SidecarLink


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.cleanup()


def holds(obs: Observed) -> list[str]:
    return [a.decision.reason for a in obs.log if any(isinstance(x, HoldTrainer) for x in a.decision.actions)]


def counted(obs: Observed, outcome: str) -> float:
    return obs.coord.metrics.duplicate_hosts.labels(outcome)._value.get()  # noqa: SLF001


async def test_two_sidecars_for_one_host_cost_no_hold_no_shrink_no_retry(procs: Procs) -> None:
    obs = await start_coordinator(num_slices=2, elastic_min_slice_count=1)
    trainer = FakeTrainer(f"127.0.0.1:{obs.coord.trainer_port}", job=JOB)
    try:
        pw, pw_port = await start_pathways(procs)
        target = ("--health-target", f"127.0.0.1:{pw_port}")
        first = procs.worker(obs.coord.port, 1, extra=(*target, "--pod", "pod-a", "--node", "node-a"))
        ps = [procs.worker(obs.coord.port, 0), first]
        await wait_registered(obs, {(0, 0), (1, 0)}, [pw, *ps])
        await trainer.attach()
        await obs.wait_for(
            lambda: obs.coord.state.phase == Phase.RUNNING and not obs.coord.state.trainer.resume_pending,
            10.0,
            "the job to run",
        )
        a = obs.coord.state.hosts[(1, 0)].incarnation

        second = procs.worker(obs.coord.port, 1, extra=(*target, "--pod", "pod-b", "--node", "node-b"))
        b = await obs.wait_for(
            lambda: (r := obs.coord.state.hosts.get((1, 0))) is not None and r.incarnation != a and r.incarnation,
            START_TIMEOUT,
            "the second sidecar to speak for host 1.0",
            [second],
        )
        # The older one is refused (ALREADY_EXISTS) and stands by with backoff: it does not take the host back.
        await obs.wait_for(lambda: counted(obs, "refused") >= 1, 10.0, "the older sidecar to be refused", ps)
        await asyncio.sleep(3.0)
        assert obs.coord.state.hosts[(1, 0)].incarnation == b
        assert first.poll() is None and second.poll() is None  # neither exits
        assert counted(obs, "took_over") == 1
        assert not holds(obs), holds(obs)
        s = obs.coord.state
        assert s.phase == Phase.RUNNING and s.retries_used == 0 and s.active == frozenset({0, 1})

        # The newer one goes (its sidecar alone: the host still answers): the older one takes over, no loss.
        second.kill()
        await obs.wait_for(
            lambda: obs.coord.state.hosts.get((1, 0)) is not None and obs.coord.state.hosts[(1, 0)].incarnation == a,
            START_TIMEOUT,
            "the standing-by sidecar to take over",
            [first],
        )
        assert counted(obs, "returned") == 1
        assert not holds(obs), holds(obs)
        s = obs.coord.state
        assert s.phase == Phase.RUNNING and s.retries_used == 0 and s.active == frozenset({0, 1})
    finally:
        await trainer.close()
        await obs.coord.stop(grace=0.1)


async def test_two_trainer_links_for_one_job_attach_at_most_twice_in_5_s() -> None:
    obs = await start_coordinator(num_slices=1)
    address = f"127.0.0.1:{obs.coord.trainer_port}"

    def hello() -> trainer_pb2.TrainerHello:
        return trainer_pb2.TrainerHello(job=JOB, step_in_memory=-1)

    links = [SidecarLink(address, hello).start() for _ in range(2)]
    try:
        await obs.wait_for(lambda: any(link.connected.is_set() for link in links), 10.0, "a link to attach")
        t0 = time.monotonic()
        await asyncio.sleep(5.0)
        attaches = [a for a in obs.events(TrainerAttached) if a.at >= t0 - 1.0]
        assert len(attaches) <= 2, f"{len(attaches)} attaches in 5 s"
        assert sum(link.connected.is_set() for link in links) == 1
        (loser,) = [link for link in links if not link.connected.is_set()]
        assert "ALREADY_EXISTS" in loser.last_error and "already attached" in loser.last_error
        assert obs.coord.metrics.duplicate_trainer_links._value.get() >= 1  # noqa: SLF001
    finally:
        for link in links:
            await asyncio.to_thread(link.close)
        await obs.coord.stop(grace=0.1)
