"""The admin gRPC API against an in-process coordinator (and a worker) over loopback gRPC.

Authentication (missing and wrong tokens, what is exempt, what gets logged),
request validation, the decision core's refusals, status content, the event
stream, checkpoints, the worker's read-only subset, and the peer token on the
coordinator's main port.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from agent.auth import BearerToken
from agent.config import WorkerConfig
from agent.core.model import NodeNotice, Phase, WorkerLost
from agent.servers.admin import READ_ONLY
from agent.worker import Worker
from protos.elastic_sidecar.v1 import admin_pb2, admin_pb2_grpc, peer_pb2_grpc
from tests.servers.conftest import JOB, Job, start_job, wait_for, write_token


def stub(job: Job) -> tuple[grpc.aio.Channel, admin_pb2_grpc.AdminStub]:
    ch = grpc.aio.insecure_channel(job.admin_address)
    return ch, admin_pb2_grpc.AdminStub(ch)


async def call_code(coro: object) -> tuple[grpc.StatusCode, str]:
    try:
        await coro  # type: ignore[misc]
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def counter(job: Job, name: str, **labels: str) -> float:
    from prometheus_client import generate_latest

    text = generate_latest(job.coord.metrics.registry).decode()
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


# ---------------------------------------------------------------------------
# authentication
# ---------------------------------------------------------------------------


async def test_calls_without_or_with_a_wrong_token_are_unauthenticated_and_logged(
    job: Job, admin_token: BearerToken
) -> None:
    secret = admin_token.metadata()[0][1].split()[1]
    ch, s = stub(job)
    async with ch:
        with structlog.testing.capture_logs() as logs:
            missing = await call_code(s.GetStatus(admin_pb2.GetStatusRequest()))
            wrong = await call_code(
                s.Hold(admin_pb2.HoldRequest(reason="x"), metadata=(("authorization", "Bearer not-the-token"),))
            )
            malformed = await call_code(
                s.GetStatus(admin_pb2.GetStatusRequest(), metadata=(("authorization", secret),))
            )
            ok = await call_code(s.GetStatus(admin_pb2.GetStatusRequest(), metadata=admin_token.metadata()))
    assert missing[0] == grpc.StatusCode.UNAUTHENTICATED and "authorization" in missing[1]
    assert wrong[0] == grpc.StatusCode.UNAUTHENTICATED and "does not match" in wrong[1]
    assert malformed[0] == grpc.StatusCode.UNAUTHENTICATED
    assert ok[0] == grpc.StatusCode.OK
    refused = [r for r in logs if r["event"].startswith("admin call refused")]
    assert [(r["method"], r["token"]) for r in refused] == [
        ("/elastic_sidecar.v1.Admin/GetStatus", "missing"),
        ("/elastic_sidecar.v1.Admin/Hold", "wrong"),
        ("/elastic_sidecar.v1.Admin/GetStatus", "malformed"),
    ]
    assert all(r["peer"].startswith("ipv4:127.0.0.1:") and r["log_level"] == "warning" for r in refused)
    for r in logs:
        assert secret not in repr(r) and "not-the-token" not in repr(r), r
    # A refused Hold never reached the decision core.
    assert job.coord.state.phase == Phase.STARTING
    assert counter(job, "elastic_sidecar_auth_failures_total", service="admin", reason="missing") == 1
    assert counter(job, "elastic_sidecar_auth_failures_total", service="admin", reason="wrong") == 1


async def test_health_and_reflection_need_no_token(job: Job) -> None:
    async with grpc.aio.insecure_channel(job.admin_address) as ch:
        h = health_pb2_grpc.HealthStub(ch)
        for service in ("", "elastic_sidecar.v1.Admin"):
            r = await h.Check(health_pb2.HealthCheckRequest(service=service))
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        call = refl.ServerReflectionInfo()
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        resp = await asyncio.wait_for(call.read(), 5.0)
        names = {svc.name for svc in resp.list_services_response.service}
        await call.write(reflection_pb2.ServerReflectionRequest(file_containing_symbol="elastic_sidecar.v1.Admin"))
        files = await asyncio.wait_for(call.read(), 5.0)
        await call.done_writing()
    assert {"elastic_sidecar.v1.Admin", "grpc.health.v1.Health"} <= names
    assert files.file_descriptor_response.file_descriptor_proto, "reflection cannot describe the Admin service"


# ---------------------------------------------------------------------------
# validation and refusals
# ---------------------------------------------------------------------------


async def test_malformed_requests_are_invalid_argument_naming_the_field(job: Job, admin_token: BearerToken) -> None:
    await job.running()
    md = admin_token.metadata()
    ch, s = stub(job)
    async with ch:
        cases = {
            "hold": s.Hold(admin_pb2.HoldRequest(reason="  "), metadata=md),
            "resume": s.Resume(admin_pb2.ResumeRequest(), metadata=md),
            "abort": s.Abort(admin_pb2.AbortRequest(), metadata=md),
            "drain-reason": s.DrainSlice(admin_pb2.DrainSliceRequest(slice=1), metadata=md),
            "drain-slice": s.DrainSlice(admin_pb2.DrainSliceRequest(slice=4, reason="r"), metadata=md),
            "drain-negative": s.DrainSlice(admin_pb2.DrainSliceRequest(slice=-1, reason="r"), metadata=md),
            "timeout": s.Checkpoint(admin_pb2.CheckpointRequest(reason="r", timeout_seconds=-1), metadata=md),
            "checkpoint": s.Checkpoint(admin_pb2.CheckpointRequest(reason=" "), metadata=md),
            "long": s.Hold(admin_pb2.HoldRequest(reason="x" * 5000), metadata=md),
        }
        got = {k: await call_code(v) for k, v in cases.items()}
        backlog = await call_code(s.WatchEvents(admin_pb2.WatchEventsRequest(backlog=-3), metadata=md).read())
    for k, (code, detail) in got.items():
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (k, code, detail)
    for k in ("hold", "resume", "abort", "drain-reason", "checkpoint", "long"):
        assert got[k][1].startswith("reason "), got[k]
    assert "slice 4" in got["drain-slice"][1] and "0..3" in got["drain-slice"][1]
    assert "slice -1" in got["drain-negative"][1] and "0..3" in got["drain-negative"][1]
    assert "timeout_seconds" in got["timeout"][1] and "-1" in got["timeout"][1]
    assert backlog[0] == grpc.StatusCode.INVALID_ARGUMENT and "backlog" in backlog[1]
    # None of them reached the decision core.
    assert job.coord.state.phase == Phase.RUNNING and not job.coord.state.drains


async def test_resume_while_running_is_failed_precondition_with_the_cores_reason(
    job: Job, admin_token: BearerToken
) -> None:
    await job.running()
    ch, s = stub(job)
    async with ch:
        code, detail = await call_code(s.Resume(admin_pb2.ResumeRequest(reason="go"), metadata=admin_token.metadata()))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert detail == "the job is running and not held by an operator"
    # Counted before the status leaves (the interceptor counts inside abort), so no waiting here.
    assert counter(job, "elastic_sidecar_admin_requests_total", method="Resume", code="FAILED_PRECONDITION") == 1


async def test_hold_then_resume_and_drain(job: Job, admin_token: BearerToken) -> None:
    await job.running()
    md = admin_token.metadata()
    ch, s = stub(job)
    async with ch:
        reply = await s.Hold(admin_pb2.HoldRequest(reason="node pool upgrade"), metadata=md)
        assert (reply.generation, reply.phase) == (2, "holding")
        assert "operator hold: node pool upgrade" in reply.reason
        await wait_for(lambda: job.coord.state.phase == Phase.WAITING, 5.0, "the trainer to hold")
        assert job.trainer.kinds()[-1] == "hold" and job.trainer.commands[-1].hold.flush
        again = await s.Hold(admin_pb2.HoldRequest(reason="still"), metadata=md)
        assert again.phase == "waiting" and "already holding" in again.reason
        reply = await s.Resume(admin_pb2.ResumeRequest(reason="upgrade done"), metadata=md)
        assert reply.phase == "running"
        await wait_for(lambda: not job.coord.state.trainer.resume_pending, 5.0, "the trainer to resume")
        reply = await s.DrainSlice(admin_pb2.DrainSliceRequest(slice=2, reason="bad ICI link"), metadata=md)
        assert reply.phase == "holding" and "draining slice 2" in reply.reason
        await wait_for(
            lambda: job.coord.state.active == frozenset({0, 1, 3}) and not job.coord.state.trainer.resume_pending,
            5.0,
            "training to continue without slice 2",
        )
        st = await s.GetStatus(admin_pb2.GetStatusRequest(), metadata=md)
    assert [sl.state for sl in st.slices] == ["active", "active", "draining", "active"]
    assert st.slices[2].detail == "operator_drain from operator: bad ICI link"
    assert list(st.active_slices) == [0, 1, 3] and list(st.inactive_slices) == [2]
    (notice,) = st.pending_notices
    assert (notice.slice, notice.kind, notice.source, notice.reason) == (
        2,
        "operator_drain",
        "operator",
        "bad ICI link",
    )
    assert notice.deadline_unix == 0.0
    assert counter(job, "elastic_sidecar_events_total", source="operator", kind="OperatorCommand") == 4
    assert counter(job, "elastic_sidecar_recoveries_total") == 2


async def test_undrain_of_a_notice_drain_needs_force(job: Job, admin_token: BearerToken) -> None:
    await job.running()
    d = await job.coord.request(NodeNotice("upcomingMaintenance", "pubsub", node="node-1", deadline=1e12))
    assert 1 in d.state.drains, d.reason
    md = admin_token.metadata()
    ch, s = stub(job)
    async with ch:
        code, detail = await call_code(
            s.UndrainSlice(admin_pb2.UndrainSliceRequest(slice=1, reason="notice is wrong"), metadata=md)
        )
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "--force" in detail, detail
        assert 1 in job.coord.state.drains
        # capture_logs swaps the processors only: a level filter an earlier test configured would drop
        # the decision's info line before it, so let every level through while capturing.
        level_filter = structlog.get_config()["wrapper_class"]
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
        try:
            with structlog.testing.capture_logs() as logs:
                reply = await s.UndrainSlice(
                    admin_pb2.UndrainSliceRequest(slice=1, reason="notice is wrong", force=True), metadata=md
                )
        finally:
            structlog.configure(wrapper_class=level_filter)
    assert "slice 1 no longer drained" in reply.reason and "forced" in reply.reason, reply.reason
    assert 1 not in job.coord.state.drains
    # The operator's reason is in the coordinator's log of the decision.
    assert any("operator undrain: notice is wrong" in r["event"] and "forced" in r["event"] for r in logs), logs


async def test_abort_stops_the_coordinator_with_the_requested_code(job: Job, admin_token: BearerToken) -> None:
    await job.running()
    ch, s = stub(job)
    async with ch:
        reply = await s.Abort(
            admin_pb2.AbortRequest(reason="wrong data", restart=True), metadata=admin_token.metadata()
        )
    assert reply.phase == "failed" and "exit code 42" in reply.reason
    assert job.coord.exit_code is not None
    assert await asyncio.wait_for(job.coord.exit_code, 5.0) == 42
    assert job.trainer.kinds()[-1] == "abort" and job.trainer.commands[-1].abort.exit_code == 42


# ---------------------------------------------------------------------------
# status and events
# ---------------------------------------------------------------------------


async def test_get_status_reports_slices_hosts_steps_and_policy(job: Job, admin_token: BearerToken) -> None:
    ch, s = stub(job)
    md = admin_token.metadata()
    async with ch:
        before = await s.GetStatus(admin_pb2.GetStatusRequest(), metadata=md)
        await job.running()
        await job.trainer.advance(7)
        await wait_for(lambda: job.coord.state.trainer.last_step == 7, 5.0, "step 7")
        job.coord.submit(WorkerLost(3, 0, "inc-3", "stream_closed", 0.0))
        await wait_for(
            lambda: job.coord.state.active == frozenset({0, 1, 2}) and not job.coord.state.trainer.resume_pending,
            5.0,
            "training to continue on slices 0-2 after slice 3 went",
        )
        st = await s.GetStatus(admin_pb2.GetStatusRequest(), metadata=md)
    assert before.phase == "starting" and [sl.state for sl in before.slices] == ["down"] * 4
    assert before.slices[0].detail == "host(s) 0 not registered" and not before.trainer_attached
    assert (st.role, st.job, st.phase) == ("coordinator", JOB, "running")
    assert st.generation == 2 and st.last_step == 7 and st.last_committed_step == 7
    assert [sl.slice for sl in st.slices] == [0, 1, 2, 3]
    assert [sl.state for sl in st.slices] == ["active", "active", "active", "down"]
    h = st.slices[1].hosts[0]
    assert (h.host, h.registered, h.healthy, h.node, h.node_pool, h.incarnation) == (
        0,
        True,
        True,
        "node-1",
        "pool-1",
        "inc-1",
    )
    assert not st.slices[3].hosts[0].registered
    assert list(st.active_slices) == [0, 1, 2] and list(st.inactive_slices) == [3]
    assert st.retries_used == 1
    assert (st.elastic_min_slice_count, st.elastic_timeout_seconds, st.elastic_max_retries) == (2, 30.0, 10)
    assert st.trainer_attached and not st.operator_hold
    assert st.last_reason == job.coord.last_reason and st.last_reason


async def test_watch_events_sends_the_backlog_then_live_decisions(job: Job, admin_token: BearerToken) -> None:
    await job.running()
    md = admin_token.metadata()
    ch, s = stub(job)
    async with ch:
        call = s.WatchEvents(admin_pb2.WatchEventsRequest(backlog=3), metadata=md)
        initial = dict(await asyncio.wait_for(call.initial_metadata(), 5.0))
        backlog = [await asyncio.wait_for(call.read(), 5.0) for _ in range(int(initial["backlog-count"]))]
        await s.Hold(admin_pb2.HoldRequest(reason="look at the stream"), metadata=md)
        live = [await asyncio.wait_for(call.read(), 5.0) for _ in range(2)]
        call.cancel()
    assert initial["backlog-count"] == "3"
    recent = list(job.coord.feed.recent)
    assert [e.reason for e in backlog] == [r["reason"] for r in recent[-5:-2]]
    assert all(e.time_unix > 0 and e.trigger for e in backlog)
    hold, held = live
    assert hold.trigger == "OperatorCommand" and "operator hold: look at the stream" in hold.reason
    assert hold.phase == "holding" and hold.generation == 2 and list(hold.active_slices) == [0, 1, 2, 3]
    assert any(a.startswith("HoldTrainer(generation=2, flush=True") for a in hold.actions), hold.actions
    assert held.trigger == "TrainerHeld" and held.phase == "waiting"
    await wait_for(lambda: not job.coord.feed.subscribers, 5.0, "the cancelled stream to unsubscribe")
    await wait_for(
        lambda: counter(job, "elastic_sidecar_admin_requests_total", method="WatchEvents", code="CANCELLED") == 1,
        5.0,
        "the cancelled stream to be counted",
    )


async def test_checkpoint_returns_the_committed_step_or_deadline_exceeded(job: Job, admin_token: BearerToken) -> None:
    md = admin_token.metadata()
    ch, s = stub(job)
    async with ch:
        early = await call_code(s.Checkpoint(admin_pb2.CheckpointRequest(reason="too early"), metadata=md))
        await job.running()
        await job.trainer.advance(12)
        await wait_for(lambda: job.coord.state.trainer.last_step == 12, 5.0, "step 12")
        reply = await s.Checkpoint(admin_pb2.CheckpointRequest(reason="before the upgrade"), metadata=md)
        job.trainer.answer_flush = False
        request = admin_pb2.CheckpointRequest(reason="late", timeout_seconds=0.2)
        late = await call_code(s.Checkpoint(request, metadata=md, timeout=5))
    assert early == (grpc.StatusCode.FAILED_PRECONDITION, "no trainer is attached")
    assert (reply.committed_step, reply.generation) == (12, 1) and reply.flush_seconds == pytest.approx(0.01)
    assert job.coord.state.trainer.committed_step == 12
    assert late[0] == grpc.StatusCode.DEADLINE_EXCEEDED and "0.2 s" in late[1]


# ---------------------------------------------------------------------------
# workers: read-only
# ---------------------------------------------------------------------------


def worker_config(job: Job, **kw: object) -> WorkerConfig:
    base: dict[str, object] = dict(
        job=JOB,
        coordinator=f"127.0.0.1:{job.coord.port}",
        slice=1,
        host=0,
        node="node-w",
        node_pool="pool-w",
        pod="",
        health_target=None,
        health_check="grpc",
        log_format="json",
        log_level="warning",
        admin_listen="127.0.0.1:0",
    )
    base.update(kw)
    return WorkerConfig(**base)  # type: ignore[arg-type]


async def test_worker_admin_is_read_only(job: Job) -> None:
    w = Worker(worker_config(job))
    task = asyncio.create_task(w.run())
    try:
        await wait_for(lambda: w.registered.is_set() and w.admin is not None, 10.0, "the worker to register")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{w.admin.port}") as ch:
            s = admin_pb2_grpc.AdminStub(ch)
            st = await s.GetStatus(admin_pb2.GetStatusRequest())
            events = s.WatchEvents(admin_pb2.WatchEventsRequest(backlog=10))
            first = await asyncio.wait_for(events.read(), 5.0)
            events.cancel()
            refusals = [
                await call_code(s.Hold(admin_pb2.HoldRequest(reason="r"))),
                await call_code(s.Resume(admin_pb2.ResumeRequest(reason="r"))),
                await call_code(s.DrainSlice(admin_pb2.DrainSliceRequest(slice=1, reason="r"))),
                await call_code(s.Checkpoint(admin_pb2.CheckpointRequest(reason="r"))),
                await call_code(s.Abort(admin_pb2.AbortRequest(reason="r"))),
            ]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await w.stop_servers()
    assert (st.role, st.job, st.slice, st.host, st.coordinator_connected, st.phase) == (
        "worker",
        JOB,
        1,
        0,
        True,
        "registered",
    )
    (sl,) = st.slices
    assert sl.state == "up" and sl.hosts[0].healthy and sl.hosts[0].node == "node-w"
    assert sl.hosts[0].incarnation == w.incarnation
    assert first.trigger == "Registered" and "registered with the coordinator" in first.reason
    assert refusals == [(grpc.StatusCode.FAILED_PRECONDITION, READ_ONLY)] * 5


# ---------------------------------------------------------------------------
# the peer token on the coordinator's main port
# ---------------------------------------------------------------------------


async def test_peer_token_is_required_on_join_but_not_for_health_or_the_trainer(tmp_path: Path) -> None:
    peer = write_token(tmp_path / "peer-token")
    j = await start_job(tmp_path, peer_token=peer, admin=False, http=False)
    try:
        with structlog.testing.capture_logs() as logs:
            refused = Worker(worker_config(j, peer_token=write_token(tmp_path / "other", "wrong-token-value")))
            assert await asyncio.wait_for(refused.run(), 10.0) == 2
            anonymous = Worker(worker_config(j, slice=2))
            assert await asyncio.wait_for(anonymous.run(), 10.0) == 2
        lines = [r for r in logs if r["event"].startswith("peer call refused")]
        assert [(r["method"], r["token"]) for r in lines] == [
            ("/elastic_sidecar.v1.Peer/Join", "wrong"),
            ("/elastic_sidecar.v1.Peer/Join", "missing"),
        ]
        assert "wrong-token-value" not in repr(logs)
        assert not j.coord.state.hosts, "a refused worker must not register"
        # The right token registers.
        good = Worker(worker_config(j, peer_token=peer, admin_listen=None))
        task = asyncio.create_task(good.run())
        await wait_for(lambda: (1, 0) in j.coord.state.hosts, 10.0, "the worker with the token to register")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{j.coord.port}") as ch:
            r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
            assert r.status == health_pb2.HealthCheckResponse.SERVING
            call = peer_pb2_grpc.PeerStub(ch).Join()
            # Refused before any message is read: a write first would race the refusal (grpc-aio can
            # then fail the write as INTERNAL), so only the status is read.
            code, _ = await call_code(asyncio.wait_for(call.read(), 10))
            assert code == grpc.StatusCode.UNAUTHENTICATED
        # The trainer link on the same port takes no token (loopback inside the pod).
        await j.trainer.attach()
        await wait_for(lambda: j.coord.state.trainer.attached, 5.0, "the trainer to attach without a token")
    finally:
        await j.trainer.close()
        await j.coord.stop(grace=0.1)


async def test_corrupt_request_bytes_are_invalid_argument_and_counted(job: Job, admin_token: BearerToken) -> None:
    async with grpc.aio.insecure_channel(job.admin_address) as ch:
        raw = ch.unary_unary("/elastic_sidecar.v1.Admin/Hold")  # no serializers: bytes on the wire as given
        code, detail = await call_code(raw(b"\xff\xff\xff\xff garbage", metadata=admin_token.metadata()))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, detail)
    assert "not a valid elastic_sidecar.v1.Admin.Hold request" in detail
    assert counter(job, "elastic_sidecar_admin_requests_total", method="Hold", code="INVALID_ARGUMENT") == 1
