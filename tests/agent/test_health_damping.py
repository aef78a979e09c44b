"""A flapping local Pathways worker is damped: down at once, back only once stable."""

from __future__ import annotations

import asyncio

from agent import worker as worker_mod
from agent.config import WorkerConfig


def _worker() -> worker_mod.Worker:
    cfg = WorkerConfig(
        job="j", coordinator="127.0.0.1:1", slice=0, host=0, node="n", node_pool="p", pod="",
        health_target="127.0.0.1:2", health_check="grpc", log_format="json", log_level="warning",
    )  # fmt: skip
    return worker_mod.Worker(cfg)


async def test_unhealthy_is_immediate_and_recovery_waits_for_stability(monkeypatch) -> None:
    monkeypatch.setattr(worker_mod, "HEALTH_STABLE_SECONDS", 0.2)
    w = _worker()
    w._on_health(True, "first SERVING")  # the first healthy verdict counts at once
    assert w.healthy
    w._on_health(False, "stream broke")
    assert not w.healthy
    for _ in range(5):  # flapping: never back in between
        w._on_health(True, "SERVING")
        await asyncio.sleep(0.05)
        assert not w.healthy
        w._on_health(False, "NOT_SERVING")
    w._on_health(True, "SERVING")
    await asyncio.sleep(0.1)
    assert not w.healthy
    await asyncio.sleep(0.2)
    assert w.healthy, "stable for the damping period: healthy again"
