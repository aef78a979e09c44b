"""The HTTP endpoints of both roles: /healthz, /readyz transitions, /metrics, /status."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from agent.config import WorkerConfig
from agent.core.model import Phase
from agent.worker import Worker
from tests.servers.conftest import JOB, Job, start_job, wait_for

# The metric names docs/operations.md ("Metrics") documents, by role.
COORDINATOR_METRICS = {
    "elastic_sidecar_up",
    "elastic_sidecar_events_total",
    "elastic_sidecar_events_ignored_total",
    "elastic_sidecar_recoveries_total",
    "elastic_sidecar_recovery_seconds",
    "elastic_sidecar_detection_seconds",
    "elastic_sidecar_lost_steps_total",
    "elastic_sidecar_active_slices",
    "elastic_sidecar_up_slices",
    "elastic_sidecar_generation",
    "elastic_sidecar_phase",
    "elastic_sidecar_flush_seconds",
    "elastic_sidecar_flush_bytes_total",
    "elastic_sidecar_trainer_step",
    "elastic_sidecar_committed_step",
    "elastic_sidecar_goodput_ratio",
    "elastic_sidecar_workers_connected",
    "elastic_sidecar_heartbeat_datagrams_total",
    "elastic_sidecar_pubsub_messages_received_total",
    "elastic_sidecar_pubsub_message_outcomes_total",
    "elastic_sidecar_pubsub_delivery_seconds",
    "elastic_sidecar_pubsub_settlements_total",
    "elastic_sidecar_pubsub_stream_errors_total",
    "elastic_sidecar_pubsub_streaming",
    "elastic_sidecar_admin_requests_total",
    "elastic_sidecar_auth_failures_total",
    "elastic_sidecar_straggler_windows_total",
    "elastic_sidecar_straggler_slices",
    "elastic_sidecar_straggler_max_lateness_ratio",
    "elastic_sidecar_straggler_step_slowdown_ratio",
    "elastic_sidecar_straggler_verdicts_total",
    "elastic_sidecar_straggler_replacements_total",
}
WORKER_METRICS = {
    "elastic_sidecar_up",
    "elastic_sidecar_coordinator_connected",
    "elastic_sidecar_local_healthy",
    "elastic_sidecar_generation",
    "elastic_sidecar_coordinator_reconnects_total",
    "elastic_sidecar_metadata_notices_total",
    "elastic_sidecar_admin_requests_total",
    "elastic_sidecar_auth_failures_total",
}


async def get(url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.text()


async def get_json(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.json()


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def exposed(fams: dict[str, Any]) -> set[str]:
    """Metric names as documented: the parser drops a counter family's ``_total``; put it back."""
    return {f.name + ("_total" if f.type == "counter" else "") for f in fams.values()}


def sample(fams: dict[str, Any], family: str, name: str, **labels: str) -> float:
    return sum(
        s.value for s in fams[family].samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


async def test_healthz_and_metrics_of_the_coordinator(job: Job) -> None:
    status, _, body = await get(job.http_url + "/healthz")
    assert (status, body) == (200, "ok\n")
    await job.running()
    await job.trainer.advance(3)
    await wait_for(lambda: job.coord.state.trainer.last_step == 3, 5.0, "step 3")
    status, ctype, text = await get(job.http_url + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    fams = families(text)
    missing = COORDINATOR_METRICS - exposed(fams)
    assert not missing, f"documented metrics missing from /metrics: {sorted(missing)}"
    assert sample(fams, "elastic_sidecar_up", "elastic_sidecar_up", role="coordinator") == 1
    assert sample(fams, "elastic_sidecar_active_slices", "elastic_sidecar_active_slices") == 4
    assert sample(fams, "elastic_sidecar_trainer_step", "elastic_sidecar_trainer_step") == 3
    assert sample(fams, "elastic_sidecar_phase", "elastic_sidecar_phase", phase="running") == 1
    assert (
        sample(fams, "elastic_sidecar_events", "elastic_sidecar_events_total", source="worker", kind="WorkerJoined")
        == 4
    )
    for fam in fams.values():
        for s in fam.samples:
            assert not {"slice", "host", "node"} & set(s.labels), f"high-cardinality label on {s.name}: {s.labels}"
            assert not s.name.endswith("_created"), f"{s.name}: _created series are turned off"


async def test_coordinator_readyz_does_not_wait_for_workers_but_for_the_trainer_once_running(job: Job) -> None:
    url = job.http_url + "/readyz"
    # Fresh: no worker has joined and no trainer attached, yet ready (the head pod starts first).
    assert await get_json(url) == (
        200,
        {"ready": True, "checks": {"grpc": True, "not_fenced": True, "state_durable": True, "deciding": True}},
    )
    await job.running()
    assert await get_json(url) == (
        200,
        {
            "ready": True,
            "checks": {"grpc": True, "not_fenced": True, "state_durable": True, "deciding": True, "trainer": True},
        },
    )
    await job.trainer.close()
    await wait_for(lambda: not job.coord.state.trainer.attached, 5.0, "the trainer link to close")
    assert job.coord.state.phase == Phase.RUNNING
    assert await get_json(url) == (
        503,
        {
            "ready": False,
            "checks": {"grpc": True, "not_fenced": True, "state_durable": True, "deciding": True, "trainer": False},
        },
    )


async def test_coordinator_readyz_does_not_depend_on_the_pubsub_intake(tmp_path: Path) -> None:
    """Notices are an optimisation: a broken subscription must not keep the job from starting.

    (tests/sources/test_intake_degraded.py runs the real intake on a missing subscription.)
    """
    j = await start_job(tmp_path, pubsub_subscription=None)
    try:
        j.coord.cfg = replace(j.coord.cfg, pubsub_subscription="projects/p/subscriptions/s")
        url = j.http_url + "/readyz"
        assert await get_json(url) == (
            200,
            {"ready": True, "checks": {"grpc": True, "not_fenced": True, "state_durable": True, "deciding": True}},
        )
        j.coord.serving = False
        status, body = await get_json(url)
        assert status == 503 and body["checks"]["grpc"] is False
    finally:
        await j.coord.stop(grace=0.1)


async def test_status_json_is_getstatus_plus_recent_decisions(job: Job) -> None:
    await job.running()
    status, doc = await get_json(job.http_url + "/status")
    assert status == 200
    assert doc["role"] == "coordinator" and doc["job"] == JOB and doc["phase"] == "running"
    assert doc["generation"] == 1 and isinstance(doc["generation"], int)
    assert doc["active_slices"] == [0, 1, 2, 3] and doc["inactive_slices"] == []
    assert [s["state"] for s in doc["slices"]] == ["active"] * 4
    assert doc["slices"][2]["hosts"] == [
        {
            "host": 0,
            "registered": True,
            "healthy": True,
            "node": "node-2",
            "node_pool": "pool-2",
            "incarnation": "inc-2",
            "sidecar_away": False,
        }
    ]
    assert doc["epoch"] == job.coord.epoch and doc["fenced_by_epoch"] == 0
    assert doc["state_durable"] is True and doc["state_problem"] == ""
    assert doc["last_committed_step"] == -1 and doc["pending_notices"] == [] and doc["operator_hold"] is False
    reasons = [d["reason"] for d in doc["recent_decisions"]]
    assert reasons == [r["reason"] for r in job.coord.feed.recent][-len(reasons) :]
    assert any("starting; resume generation 1" in r for r in reasons), reasons


def worker_config(coordinator: str, **kw: Any) -> WorkerConfig:
    return WorkerConfig(
        job=JOB,
        coordinator=coordinator,
        slice=2,
        host=0,
        node="node-w",
        node_pool="pool-w",
        pod="",
        health_target=None,
        health_check="grpc",
        log_format="json",
        log_level="warning",
        http_listen="127.0.0.1:0",
        **kw,
    )


async def test_worker_readyz_follows_its_registration(tmp_path: Path) -> None:
    j = await start_job(tmp_path, admin=False, http=False)
    w = Worker(worker_config(f"127.0.0.1:{j.coord.port}"))
    task = asyncio.create_task(w.run())
    coordinator_stopped = False
    try:
        await wait_for(lambda: w.http is not None, 10.0, "the worker's HTTP server")
        url = f"http://127.0.0.1:{w.http.port}"
        await wait_for(lambda: w.registered.is_set(), 10.0, "the worker to register")
        assert await get_json(url + "/readyz") == (200, {"ready": True, "checks": {"registered": True}})
        status, doc = await get_json(url + "/status")
        assert status == 200 and doc["role"] == "worker" and doc["slice"] == 2 and doc["coordinator_connected"]
        assert doc["recent_decisions"][-1]["trigger"] == "Registered"
        _, _, text = await get(url + "/metrics")
        fams = families(text)
        assert not WORKER_METRICS - exposed(fams), sorted(WORKER_METRICS - exposed(fams))
        assert sample(fams, "elastic_sidecar_coordinator_connected", "elastic_sidecar_coordinator_connected") == 1
        assert sample(fams, "elastic_sidecar_up", "elastic_sidecar_up", role="worker") == 1
        # The coordinator goes away: the worker stays alive but is no longer ready.
        await j.coord.stop(grace=0)
        coordinator_stopped = True
        await wait_for(lambda: not w.registered.is_set(), 10.0, "the worker to notice")
        assert await get_json(url + "/readyz") == (503, {"ready": False, "checks": {"registered": False}})
        assert (await get(url + "/healthz"))[0] == 200
        _, _, text = await get(url + "/metrics")
        fams = families(text)
        assert sample(fams, "elastic_sidecar_coordinator_connected", "elastic_sidecar_coordinator_connected") == 0
        await wait_for(lambda: w.metrics.reconnects._value.get() >= 1, 10.0, "a reconnect attempt")  # noqa: SLF001
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await w.stop_servers()
        if not coordinator_stopped:
            await j.coord.stop(grace=0)


@pytest.mark.parametrize("server", ["admin", "http"])
async def test_an_address_in_use_stops_the_coordinator_with_exit_2(server: str) -> None:
    """A sidecar whose port another process holds must not start: operators would reach the other process."""
    from agent.coordinator import Coordinator
    from tests.servers.conftest import coordinator_config

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = f"127.0.0.1:{holder.getsockname()[1]}"
        cfg = replace(coordinator_config(), **{f"{server}_listen": taken})
        coord = Coordinator(cfg)
        with structlog.testing.capture_logs() as logs:
            code = await asyncio.wait_for(coord.run(), 10.0)
    assert code == 2
    (line,) = [r for r in logs if r["event"] == "coordinator could not start"]
    assert f"could not listen on {taken}" in line["error"]
    assert not coord.serving


async def test_a_half_sent_or_silent_connection_is_closed_after_the_idle_timeout() -> None:
    from prometheus_client import CollectorRegistry

    from agent.servers.http import start_http_server

    server = await start_http_server(
        "127.0.0.1:0", status=dict, ready=lambda: {"ok": True}, registry=CollectorRegistry(), idle_timeout=0.5
    )
    try:

        async def closed_by_the_server(first: bytes) -> bytes:
            """Send ``first``, then nothing: what the server sends before it closes the connection."""
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            try:
                writer.write(first)
                await writer.drain()
                # Far longer than the idle timeout: without it the read would wait for ever.
                return await asyncio.wait_for(reader.read(), 30.0)
            finally:
                writer.close()

        # Headers begun, never finished; a connection that never sends a byte: both closed, no answer.
        assert await closed_by_the_server(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ") == b""
        assert await closed_by_the_server(b"") == b""
        # A whole request is answered, and a half-sent one after it on the same connection is dropped too.
        got = await closed_by_the_server(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /metr")
        assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"ok\n"), got
        status, _, body = await get(f"http://127.0.0.1:{server.port}/healthz")
        assert (status, body) == (200, "ok\n")
    finally:
        await server.stop()
