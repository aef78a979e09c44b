"""A worker that cannot reach its coordinator keeps reconnecting at its pace but thins out its warnings."""

from __future__ import annotations

import asyncio
import socket

from structlog.testing import capture_logs

from agent.config import WorkerConfig
from agent.log import Backoff
from agent.worker import Worker


def test_backoff_logs_the_first_then_at_doubling_intervals_with_the_count_held_back() -> None:
    now = [0.0]
    b = Backoff(first=1.0, ceiling=4.0, clock=lambda: now[0])
    logged: list[tuple[float, int]] = []
    for _ in range(60):  # one occurrence every 0.25 s for 15 s
        if (held := b.due()) is not None:
            logged.append((now[0], held))
        now[0] += 0.25
    # Intervals 1, 2, 4, then the ceiling of 4 s; each line counts what came between.
    assert logged == [(0.0, 0), (1.0, 3), (3.0, 7), (7.0, 15), (11.0, 15)], logged
    b.reset()
    assert b.due() == 0 and b.due() is None


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_worker_without_its_coordinator_warns_less_often_than_it_reconnects() -> None:
    cfg = WorkerConfig(
        job="j",
        coordinator=f"127.0.0.1:{_closed_port()}",
        slice=0,
        host=0,
        node="n",
        node_pool="p",
        pod="",
        health_target=None,
        health_check="grpc",
        log_format="json",
        log_level="warning",
    )
    w = Worker(cfg)
    with capture_logs() as logs:
        task = asyncio.create_task(w.run())
        try:
            for _ in range(600):  # the attempts themselves: 0.05 s doubling to 1 s apart
                if w.metrics.reconnects._value.get() >= 7:
                    break
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    attempts = w.metrics.reconnects._value.get()
    warnings = [e for e in logs if e["event"] == "coordinator link lost; reconnecting"]
    assert attempts >= 7
    assert warnings and warnings[0]["not_logged"] == 0, warnings
    # Every attempt is either logged or counted in the next line logged.
    assert len(warnings) < attempts and len(warnings) + sum(e["not_logged"] for e in warnings) <= attempts
