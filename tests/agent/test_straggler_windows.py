"""Worker metrics windows reach the coordinator's straggler collector: through the same client code
a real libtpu gets (the stand-in service on loopback), blind when the service is absent, nothing
with --tpu-metrics off; and a job whose slice 2 runs slow ends with a drain verdict for slice 2 only."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.config import CoordinatorConfig, WorkerConfig
from agent.coordinator import Coordinator
from agent.core.model import (
    Phase,
    Policy,
    TrainerAttached,
    TrainerResumed,
    TrainerStepped,
)
from agent.worker import Worker
from protos.elastic_sidecar.v1 import peer_pb2
from simjob.ports import free_port
from standins.tpu_metrics import HostModel, TpuMetricsStandIn

JOB = "straggler-windows"
# Bounded waits around things that must happen on their own; they guard against a hang, they time nothing.
HANG_GUARD = 30.0


async def coordinator(num_slices: int, **kw: Any) -> Coordinator:
    coord = Coordinator(
        CoordinatorConfig(
            job=JOB,
            listen="127.0.0.1:0",
            policy=Policy(
                num_slices=num_slices, hosts_per_slice=1, elastic_min_slice_count=min(2, num_slices), settle_seconds=0.0
            ),
            heartbeat_interval=0.25,
            heartbeat_timeout=5.0,
            state_file=None,
            log_format="json",
            log_level="warning",
            admin_listen=None,
            http_listen=None,
            **{"journal": None, **kw},
        )
    )
    await coord.start()
    return coord


def worker(coord_port: int, s: int, target: str, kind: str = "service", window: float = 0.2) -> Worker:
    return Worker(
        WorkerConfig(
            job=JOB,
            coordinator=f"127.0.0.1:{coord_port}",
            slice=s,
            host=0,
            node=f"n{s}",
            node_pool="",
            pod=f"p{s}",
            health_target=None,
            health_check="grpc",
            log_format="json",
            log_level="warning",
            tpu_metrics=kind,
            tpu_metrics_target=target,
            straggler_window_seconds=window,
        )
    )


class Received:
    """Records every window the coordinator's collector is handed (it also keeps using them)."""

    def __init__(self, coord: Coordinator) -> None:
        self.windows: list[tuple[int, int, peer_pb2.MetricsWindow]] = []
        self.arrived = asyncio.Event()
        add = coord.stragglers.add_window

        def spy(s: int, h: int, msg: peer_pb2.MetricsWindow) -> None:
            self.windows.append((s, h, msg))
            self.arrived.set()
            add(s, h, msg)

        coord.stragglers.add_window = spy  # type: ignore[method-assign]

    async def until(self, pred: Any) -> None:
        async with asyncio.timeout(HANG_GUARD):
            while not any(pred(m) for _, _, m in self.windows):
                self.arrived.clear()
                await self.arrived.wait()


async def stepping(stand_ins: list[TpuMetricsStandIn], every: float) -> None:
    while True:
        for s in stand_ins:
            s.advance()
        await asyncio.sleep(every)


@pytest.fixture
async def stand_in() -> AsyncIterator[TpuMetricsStandIn]:
    s = TpuMetricsStandIn()
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


async def test_a_workers_windows_from_the_service_reach_the_coordinator(stand_in: TpuMetricsStandIn) -> None:
    coord = await coordinator(1)
    w = worker(coord.port, 0, f"127.0.0.1:{stand_in.port}")
    received = Received(coord)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(w._run(stop)), asyncio.create_task(stepping([stand_in], 0.01))]  # noqa: SLF001
    try:
        await received.until(lambda m: m.collective_count > 0)
        s, h, m = next(x for x in received.windows if x[2].collective_count > 0)
        assert (s, h) == (0, 0) and not m.blind and m.source == "service" and m.end_unix > m.start_unix
        # The stand-in's collective is its transfer alone (no slower peer): 10 ms, in seconds on the wire.
        assert m.collective_p50_seconds == pytest.approx(0.01, rel=0.25)
    finally:
        stop.set()
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await coord.stop(grace=0.1)


async def test_an_absent_service_reports_blind_windows() -> None:
    coord = await coordinator(1)
    w = worker(coord.port, 0, f"127.0.0.1:{free_port()}")
    received = Received(coord)
    stop = asyncio.Event()
    task = asyncio.create_task(w._run(stop))  # noqa: SLF001
    try:
        await received.until(lambda m: bool(m.blind))
        assert all(m.blind and not m.collective_count for _, _, m in received.windows)
        assert "UNAVAILABLE" in received.windows[0][2].blind
    finally:
        stop.set()
        await task
        await coord.stop(grace=0.1)


async def test_a_worker_with_tpu_metrics_off_starts_no_reporter() -> None:
    tasks = worker(1, 0, "127.0.0.1:1", kind="off")._start_watchers()  # noqa: SLF001
    on = worker(1, 0, "127.0.0.1:1")._start_watchers()  # noqa: SLF001
    try:
        assert [t.get_name() for t in on] == ["metrics-windows"]
        assert tasks == []
    finally:
        for t in tasks + on:
            t.cancel()
        await asyncio.gather(*tasks, *on, return_exceptions=True)


async def test_a_job_whose_slice_2_runs_slow_ends_with_a_drain_verdict_for_slice_2_only(tmp_path: Path) -> None:
    """Four one-host slices, each host's stand-in playing its part of one synchronous job: from the
    switch on, slice 2 computes 1.5 times as long and the others wait for it at the collective."""
    n, slow = 4, 2
    journal = tmp_path / "journal.jsonl"
    coord = await coordinator(n, straggler_replacement_seconds=60.0, journal=journal)
    models = [HostModel(compute_seconds=0.1) for _ in range(n)]
    stand_ins = [TpuMetricsStandIn(m) for m in models]
    ports = [await s.start() for s in stand_ins]
    workers = [worker(coord.port, s, f"127.0.0.1:{ports[s]}", window=0.25) for s in range(n)]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(w._run(stop)) for w in workers]  # noqa: SLF001
    try:
        async with asyncio.timeout(HANG_GUARD):
            while len(coord.state.up_slices()) < n:
                await asyncio.sleep(0.05)
        d = await coord.request(TrainerAttached(generation=0, step_in_memory=-1))
        (resume,) = [a for a in d.actions if hasattr(a, "active")]
        await coord.request(TrainerResumed(resume.generation, 0, resume.active, "fresh"))
        assert coord.state.phase == Phase.RUNNING
        step = 0
        async with asyncio.timeout(HANG_GUARD):
            while slow not in coord.state.drains and coord.state.phase == Phase.RUNNING:
                if step == 60:  # after a baseline of normal windows
                    models[slow].slowdown = 1.5
                    for s, m in enumerate(models):
                        m.slowest_peer = 1.5 if s != slow else 1.0
                for s in stand_ins:
                    s.advance()
                step += 1
                coord.submit(TrainerStepped(step, coord.state.generation, models[0].step()[0]))
                await asyncio.sleep(0.01)
        assert slow in coord.state.drains, (coord.last_reason, coord.stragglers.status())
        drains = [v for v in coord.stragglers.verdicts if v["action"] == "drain"]
        assert [(v["slice"], v["outcome"]) for v in drains] == [(slow, f"draining slice {slow}")], drains
        assert coord.state.drains[slow].source == "straggler"
        assert all(v["slice"] == slow for v in coord.stragglers.verdicts), list(coord.stragglers.verdicts)
        lines = [json.loads(x) for x in journal.read_text().splitlines()]
        (line,) = [x for x in lines if x["trigger"] == "StragglerVerdict"]
        detail = line["event_detail"]
        assert (detail["slice"], detail["scope"], detail["action"]) == (slow, "slice", "drain")
        assert detail["slowdown"] > 0.3 and detail["lateness"] > 0.2 and detail["since"] <= line["time"]
        assert [a["type"] for a in line["actions"]] == ["HoldTrainer", "TellWorkers"], line["actions"]
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in stand_ins:
            await s.stop()
        await coord.stop(grace=0.1)
