"""The trainer hooks: a light import, a cheap step boundary, and the hold/resume/abort
protocol against a real in-process coordinator over a real gRPC stream."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.config import CoordinatorConfig
from agent.coordinator import Coordinator
from agent.core.model import (
    Decision,
    Event,
    Phase,
    Policy,
    TrainerHeld,
    TrainerResumed,
    WorkerJoined,
    WorkerLost,
)
from protos.elastic_sidecar.v1 import trainer_pb2
from tests.agent.coordinators import coordinator_config
from trainer_hooks import AbortTraining, Directive, ElasticSession, FlushResult, SidecarAddressError
from trainer_hooks.link import SidecarLink

REPO = Path(__file__).resolve().parents[2]
JOB = "session-job"
WAIT = 20.0
"""Generous: everything here is in-process, but the machine may be loaded."""


# ---------------------------------------------------------------------------
# (a) importing the hooks stays light
# ---------------------------------------------------------------------------

HEAVY = ("agent", "aiohttp", "google.cloud.pubsub", "google.cloud.pubsub_v1", "structlog", "prometheus_client")


@pytest.mark.parametrize("module", ["trainer_hooks", "trainer_hooks.orbax_flush"])
def test_import_does_not_pull_in_the_daemon(module: str) -> None:
    code = (
        "import json, sys\n"
        f"import {module}\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps({'heavy': sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in heavy)),"
        " 'grpc': 'grpc' in sys.modules, 'jax': 'jax' in sys.modules}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["heavy"] == [], f"importing {module} imported {out['heavy']}"
    assert out["grpc"]  # what it does need
    assert not out["jax"]  # the Orbax flusher imports jax only when it runs


# ---------------------------------------------------------------------------
# (b) the per-step call costs microseconds when nothing is pending
# ---------------------------------------------------------------------------


def test_step_boundary_with_nothing_pending_is_cheap() -> None:
    session = ElasticSession(SidecarLink("127.0.0.1:1", trainer_pb2.TrainerHello))  # never started: nothing arrives
    n = 100_000
    boundary = session.step_boundary
    for i in range(1000):  # warm up
        boundary(i)
    t0 = time.perf_counter()
    for i in range(n):
        if boundary(i) is not None:
            raise AssertionError("a directive out of nowhere")
    mean = (time.perf_counter() - t0) / n
    print(f"\n[session] step_boundary with nothing pending: {mean * 1e9:.0f} ns per call (mean of {n})")
    assert mean < 20e-6
    assert session.step == -1  # nothing pending: not even the step is recorded


class RecordingLink(SidecarLink):
    """A link that is never started: what the session sends is kept, in order."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1:1", trainer_pb2.TrainerHello)
        self.sent: list[trainer_pb2.TrainerMessage] = []

    def send(self, msg: trainer_pb2.TrainerMessage) -> None:
        self.sent.append(msg)

    def kinds(self) -> list[str]:
        return [str(m.WhichOneof("msg")) for m in self.sent]


def test_fast_steps_are_reported_together_with_their_mean_seconds_and_before_anything_else() -> None:
    link = RecordingLink()
    session = ElasticSession(link, report_interval=3600.0)
    session.report_step(1, 0.01)  # the first report goes at once
    for step, seconds in ((2, 0.02), (3, 0.04), (4, 0.06)):
        session.report_step(step, seconds)
    assert link.kinds() == ["step"] and link.sent[0].step.step == 1
    # Any other message sends the unsent report first: the sidecar sees step 4 before the flush.
    session.committed(4)
    assert link.kinds() == ["step", "step", "flushed"]
    report = link.sent[1].step
    assert report.step == 4 and report.step_seconds == pytest.approx(0.04)  # the mean of steps 2-4
    session.committed(5)  # nothing unsent: no empty report
    assert link.kinds() == ["step", "step", "flushed", "flushed"]


def test_an_unsent_report_keeps_its_own_step_and_generation_across_a_resume() -> None:
    link = RecordingLink()
    session = ElasticSession(link, report_interval=3600.0)
    for step in (1, 2, 3):
        session.report_step(step, 0.01)
    # The attempt restored step 2 (a rewind) under generation 2: the unsent report still says step 3, generation 0.
    session.resumed(Directive(2, (0,), "memory", "resumed"), 2, "snapshot", 0.1)
    assert link.kinds() == ["step", "step", "resumed"]
    assert (link.sent[1].step.step, link.sent[1].step.generation) == (3, 0)
    session.generation = 2
    session.report_step(3, 0.01)
    session.generation = 3  # a newer generation's steps are never merged into an older report
    session.report_step(4, 0.01)
    assert [(m.step.step, m.step.generation) for m in link.sent if m.HasField("step")][2:] == [(3, 2)]


def test_with_a_zero_interval_every_step_is_reported() -> None:
    link = RecordingLink()
    session = ElasticSession(link, report_interval=0.0)
    for step in range(1, 6):
        session.report_step(step, 0.01)
    assert [m.step.step for m in link.sent] == [1, 2, 3, 4, 5]


def test_steps_are_reported_again_once_the_interval_has_passed() -> None:
    link = RecordingLink()
    session = ElasticSession(link, report_interval=0.05)
    session.report_step(1, 0.001)
    session.report_step(2, 0.001)
    time.sleep(0.06)
    session.report_step(3, 0.003)
    assert [(m.step.step, round(m.step.step_seconds, 6)) for m in link.sent] == [(1, 0.001), (3, 0.002)]


def test_the_report_interval_comes_from_the_environment_and_a_bad_one_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainer_hooks.session import (
        ENV_REPORT_INTERVAL,
        REPORT_INTERVAL,
        SINGLE_REPORT_INTERVAL,
        report_interval_from_env,
    )

    monkeypatch.delenv(ENV_REPORT_INTERVAL, raising=False)
    # One process: its holds name no step, so reports are sparse; several: the hold's margin counts from them.
    assert report_interval_from_env() == SINGLE_REPORT_INTERVAL > REPORT_INTERVAL
    assert report_interval_from_env(2) == REPORT_INTERVAL
    for count, expected in ((1, SINGLE_REPORT_INTERVAL), (4, REPORT_INTERVAL)):
        s = ElasticSession.connect("127.0.0.1:9", process_count=count, abort_grace_seconds=None)
        try:
            assert s.report_interval == expected, count
        finally:
            s.close()
    monkeypatch.setenv(ENV_REPORT_INTERVAL, "0.2")
    assert report_interval_from_env() == 0.2
    for bad in ("-1", "soon", "nan"):
        monkeypatch.setenv(ENV_REPORT_INTERVAL, bad)
        with pytest.raises(ValueError, match=f"{ENV_REPORT_INTERVAL}='{bad}'"):
            report_interval_from_env()


# ---------------------------------------------------------------------------
# (c) the protocol against a real coordinator
# ---------------------------------------------------------------------------


@dataclass
class Rig:
    coord: Coordinator
    session: ElasticSession
    flushes: list[tuple[int, frozenset[int]]] = field(default_factory=list)
    hook_events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    applied: list[tuple[Event, Decision]] = field(default_factory=list)

    def seen(self, kind: type) -> list[Any]:
        return [e for e, _ in self.applied if isinstance(e, kind)]

    async def until(self, cond: Any, what: str, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                reasons = [d.reason for e, d in self.applied if type(e).__name__ != "Tick"][-10:]
                raise AssertionError(f"timed out waiting for {what}; decisions: {reasons}")
            await asyncio.sleep(0.005)

    def inject(self, cmd: trainer_pb2.SidecarCommand, epoch: int | None = None) -> None:
        """Send a command down the real trainer stream, as the coordinator would (stamped with its epoch)."""
        assert self.coord.trainer is not None
        cmd.epoch = getattr(self.coord, "epoch", 0) if epoch is None else epoch
        self.coord.trainer.outbox.put_nowait(cmd)


def boundary_until_directive(session: ElasticSession, step: int, timeout: float = WAIT) -> Directive:
    """The training loop: call step_boundary between steps until it returns a directive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d = session.step_boundary(step)
        if d is not None:
            return d
        time.sleep(0.002)
    raise TimeoutError(f"no directive within {timeout} s")


def _unblock(session: ElasticSession) -> None:
    """Teardown: wake any thread still blocked waiting for a command (only matters when a test failed)."""
    link = session._link
    with link._arrived:
        link.inbox.append(
            trainer_pb2.SidecarCommand(abort=trainer_pb2.Abort(generation=1 << 40, exit_code=1, reason="teardown"))
        )
        link._arrived.notify_all()


@asynccontextmanager
async def running(min_slices: int = -1, max_retries: int = 10, steps: int = 5) -> AsyncIterator[Rig]:
    """A coordinator with two registered slices, and a trainer session started on both and at ``steps``."""
    cfg = coordinator_config(
        JOB, Policy(num_slices=2, elastic_min_slice_count=min_slices, elastic_max_retries=max_retries)
    )
    coord = Coordinator(cfg)
    inner = coord.apply
    applied: list[tuple[Event, Decision]] = []

    def apply(ev: Event, now: float) -> Decision:
        d = inner(ev, now)
        applied.append((ev, d))
        return d

    coord.apply = apply  # type: ignore[method-assign]
    await coord.start()
    coord.submit(WorkerJoined(0, 0, "w0"))
    coord.submit(WorkerJoined(1, 0, "w1"))

    flushes: list[tuple[int, frozenset[int]]] = []

    def flusher(step: int, down: frozenset[int]) -> FlushResult:
        flushes.append((step, down))
        return FlushResult(step, 1234)

    hook_events: list[tuple[str, dict[str, Any]]] = []
    # The trainer link has its own listener (--trainer-listen); older coordinators served it on --listen.
    trainer_port = getattr(coord, "trainer_port", 0) or coord.port
    session = ElasticSession.connect(
        f"127.0.0.1:{trainer_port}", job=JOB, flush=flusher, on_event=lambda k, f: hook_events.append((k, f))
    )
    rig = Rig(coord, session, flushes, hook_events, applied)
    try:
        d = await asyncio.wait_for(asyncio.to_thread(session.start, -1, WAIT), WAIT + 5)
        assert d == Directive(1, (0, 1), "checkpoint", d.reason, frozenset())
        assert "starting" in d.reason
        session.resumed(d, 0, "fresh", 0.01)
        for s in range(1, steps + 1):
            assert session.step_boundary(s - 1) is None
            session.report_step(s, 0.001)
        await rig.until(
            lambda: coord.state.trainer.last_step == steps and not coord.state.trainer.resume_pending,
            f"the coordinator to see step {steps}",
        )
        assert coord.state.phase == Phase.RUNNING and coord.state.generation == 1
        assert session.generation == 1
        yield rig
    finally:
        _unblock(session)
        await asyncio.to_thread(session.close)  # off the loop: the coordinator on it ends the stream
        await coord.stop(grace=0.1)


@pytest.mark.parametrize("port", ["peer", "admin"])
async def test_a_trainer_given_another_port_of_the_sidecar_says_which_address_to_set(port: str) -> None:
    """The coordinator's peer or admin port answers gRPC but has no trainer link: within seconds,
    an error naming ELASTIC_SIDECAR_ADDRESS and --trainer-listen, instead of waiting silently."""
    cfg = coordinator_config(JOB, admin_listen="127.0.0.1:0")
    coord = Coordinator(cfg)
    await coord.start()
    try:
        assert coord.admin is not None
        address = f"127.0.0.1:{coord.port if port == 'peer' else coord.admin.port}"
        events: list[tuple[str, dict[str, Any]]] = []
        session = ElasticSession.connect(
            address, job=JOB, elastic_timeout_seconds=300, on_event=lambda k, f: events.append((k, f))
        )
        t0 = time.monotonic()
        try:
            with pytest.raises(SidecarAddressError) as ei:
                await asyncio.wait_for(asyncio.to_thread(session.start, -1), 15)
        finally:
            await asyncio.to_thread(session.close)
        waited = time.monotonic() - t0
    finally:
        await coord.stop(grace=0.1)
    text = str(ei.value)
    assert waited < 10, waited
    assert address in text and "ELASTIC_SIDECAR_ADDRESS" in text and "--trainer-listen" in text, text
    assert "UNIMPLEMENTED" in text
    assert [k for k, _ in events] == ["wrong_service"]


async def test_start_returns_a_directive_for_both_slices() -> None:
    async with running() as rig:
        st = rig.coord.state
        assert st.active == frozenset({0, 1})
        assert st.trainer.attached and st.trainer.active == frozenset({0, 1})
        assert [(e.generation, e.active, e.restored_from) for e in rig.seen(TrainerResumed)] == [
            (1, frozenset({0, 1}), "fresh")
        ]
        assert rig.flushes == []


async def test_lost_slice_holds_without_flush_when_the_survivors_suffice() -> None:
    async with running(min_slices=1) as rig:
        rig.coord.submit(WorkerLost(1, 0, "w1", "stream_closed"))
        d = await asyncio.wait_for(asyncio.to_thread(boundary_until_directive, rig.session, 5), WAIT + 5)
        assert d.generation == 2
        assert d.active_slices == (0,)
        assert d.source == "memory"
        assert d.down_slices == frozenset({1})
        assert rig.flushes == []  # training goes on from memory at once: no flush
        held = rig.seen(TrainerHeld)
        assert [(h.generation, h.step, h.committed_step) for h in held] == [(2, 5, -1)]
        assert [k for k, _ in rig.hook_events] == ["held"]
        assert rig.hook_events[0][1]["flush"] is False
        st = rig.coord.state
        assert st.phase == Phase.RUNNING and st.active == frozenset({0}) and st.generation == 2

        # The trainer rebuilds on slice 0 and acknowledges; steps carry on in generation 2.
        rig.session.resumed(d, 5, "memory", 0.02)
        rig.session.report_step(6)
        await rig.until(
            lambda: rig.coord.state.trainer.last_step == 6 and not rig.coord.state.trainer.resume_pending, "step 6"
        )
        assert rig.coord.state.trainer.active == frozenset({0})
        assert rig.session.active_slices == (0,)


async def test_lost_slice_flushes_when_every_slice_is_needed() -> None:
    async with running(min_slices=-1) as rig:
        rig.coord.submit(WorkerLost(1, 0, "w1", "heartbeat_timeout"))
        task = asyncio.ensure_future(asyncio.to_thread(boundary_until_directive, rig.session, 5))
        # Held, flushed, and waiting for the slice to come back.
        await rig.until(lambda: rig.coord.state.phase == Phase.WAITING, "the trainer to hold")
        assert not task.done()
        assert rig.flushes == [(5, frozenset({1}))]  # made durable without reading slice 1
        assert [(h.generation, h.step, h.committed_step) for h in rig.seen(TrainerHeld)] == [(2, 5, 5)]
        assert rig.coord.state.trainer.committed_step == 5
        # A replacement host brings slice 1 back: resume on both, from the survivor's memory.
        rig.coord.submit(WorkerJoined(1, 0, "w1-replacement"))
        d = await asyncio.wait_for(task, WAIT)
        assert (d.generation, d.active_slices, d.source) == (2, (0, 1), "memory")
        assert d.down_slices == frozenset({1})
        assert rig.session.committed_step == 5
        assert len(rig.flushes) == 1


async def test_abort_raises_aborttraining_with_exit_code_42() -> None:
    async with running(min_slices=1, max_retries=1) as rig:  # one recovery allowed, the second loss is terminal
        rig.coord.submit(WorkerLost(1, 0, "w1", "stream_closed"))
        d = await asyncio.wait_for(asyncio.to_thread(boundary_until_directive, rig.session, 5), WAIT + 5)
        assert d.active_slices == (0,) and rig.coord.state.retries_used == 1
        rig.session.resumed(d, 5, "memory", 0.01)
        await rig.until(lambda: not rig.coord.state.trainer.resume_pending, "the resume acknowledged")
        rig.coord.submit(WorkerLost(0, 0, "w0", "stream_closed"))
        with pytest.raises(AbortTraining) as ei:
            await asyncio.wait_for(asyncio.to_thread(boundary_until_directive, rig.session, 5), WAIT + 5)
        assert ei.value.exit_code == 42
        assert "elastic_max_retries=1" in ei.value.reason
        assert ei.value.committed_step == 5  # it flushed before giving up
        assert rig.flushes == [(5, frozenset())]
        assert rig.coord.state.phase == Phase.FAILED
        assert "exit code 42" in str(ei.value)


async def test_stale_commands_are_ignored() -> None:
    async with running(min_slices=1) as rig:
        rig.coord.submit(WorkerLost(1, 0, "w1", "stream_closed"))
        d = await asyncio.wait_for(asyncio.to_thread(boundary_until_directive, rig.session, 5), WAIT + 5)
        assert d.generation == 2 and rig.session.generation == 2
        rig.session.resumed(d, 5, "memory", 0.0)
        held_before = len(rig.seen(TrainerHeld))

        # Commands of generation 1 arrive late (e.g. repeated by a restarted coordinator).
        rig.inject(
            trainer_pb2.SidecarCommand(hold=trainer_pb2.Hold(generation=1, flush=True, down_slices=[0], reason="old"))
        )
        rig.inject(
            trainer_pb2.SidecarCommand(resume=trainer_pb2.Resume(generation=1, active_slices=[0, 1], reason="old"))
        )

        def drain() -> list[Directive | None]:
            out = []
            deadline = time.monotonic() + WAIT
            while sum(k == "stale_command" for k, _ in rig.hook_events) < 2 and time.monotonic() < deadline:
                out.append(rig.session.step_boundary(6))
                time.sleep(0.002)
            return out

        results = await asyncio.to_thread(drain)
        assert all(r is None for r in results)
        stale = [f for k, f in rig.hook_events if k == "stale_command"]
        assert [(f["kind"], f["generation"], f["current"]) for f in stale] == [("hold", 1, 2), ("resume", 1, 2)]
        assert rig.session.generation == 2
        assert rig.session.active_slices == (0,)
        assert rig.flushes == []
        await asyncio.sleep(0.1)
        assert len(rig.seen(TrainerHeld)) == held_before  # no acknowledgement went out
        assert rig.coord.state.phase == Phase.RUNNING and rig.coord.state.generation == 2


async def test_the_trainer_takes_the_coordinators_epoch_and_ignores_an_older_one() -> None:
    async with running(min_slices=1) as rig:
        epoch = getattr(rig.coord, "epoch", None)
        if not epoch:
            pytest.skip("this coordinator stamps no epoch on its commands")
        assert rig.session.epoch == epoch  # taken from the start command
        # A superseded coordinator's hold arrives on the stream: ignored, not acknowledged.
        rig.inject(trainer_pb2.SidecarCommand(hold=trainer_pb2.Hold(generation=5, flush=True, reason="old")), epoch - 1)

        def drain() -> list[Directive | None]:
            out = []
            deadline = time.monotonic() + WAIT
            while not any(k == "fenced" for k, _ in rig.hook_events) and time.monotonic() < deadline:
                out.append(rig.session.step_boundary(5))
                time.sleep(0.002)
            return out

        assert all(r is None for r in await asyncio.to_thread(drain))
        fenced = [f for k, f in rig.hook_events if k == "fenced"]
        assert [(f["kind"], f["epoch"], f["current_epoch"]) for f in fenced] == [("hold", epoch - 1, epoch)]
        assert rig.flushes == [] and rig.session.generation == 1 and rig.session.epoch == epoch
        await asyncio.sleep(0.1)
        assert rig.seen(TrainerHeld) == []


async def test_the_coordinator_takes_the_token_from_the_token_file_and_refuses_a_wrong_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    if "trainer_token" not in {f.name for f in dataclasses.fields(CoordinatorConfig)}:
        pytest.skip("this coordinator has no trainer-link token")
    from agent.auth import BearerToken

    cfg = CoordinatorConfig(
        job=JOB,
        listen="127.0.0.1:0",
        policy=Policy(num_slices=1),
        heartbeat_interval=0.25,
        heartbeat_timeout=1.2,
        state_file=None,
        journal=None,
        log_format="json",
        log_level="warning",
        trainer_token=BearerToken("right-token", "test"),  # type: ignore[call-arg]
    )
    coord = Coordinator(cfg)
    await coord.start()
    sessions: list[ElasticSession] = []
    try:
        coord.submit(WorkerJoined(0, 0, "w0"))
        address = f"127.0.0.1:{coord.trainer_port}"  # type: ignore[attr-defined]
        (tmp_path / "wrong").write_text("wrong-token\n")
        monkeypatch.setenv("ELASTIC_SIDECAR_TOKEN_FILE", str(tmp_path / "wrong"))
        wrong = ElasticSession.connect(address, job=JOB, elastic_timeout_seconds=1.0)
        sessions.append(wrong)
        with pytest.raises(AbortTraining) as ei:
            await asyncio.wait_for(asyncio.to_thread(wrong.start, -1), WAIT)
        assert ei.value.exit_code == 42 and "UNAUTHENTICATED" in ei.value.reason
        assert coord.trainer is None  # never attached

        (tmp_path / "right").write_text("  right-token\n")
        monkeypatch.setenv("ELASTIC_SIDECAR_TOKEN_FILE", str(tmp_path / "right"))
        right = ElasticSession.connect(address, job=JOB, elastic_timeout_seconds=5.0)
        sessions.append(right)
        d = await asyncio.wait_for(asyncio.to_thread(right.start, -1), WAIT)
        assert d.active_slices == (0,) and d.generation >= 1
    finally:
        for s in sessions:
            _unblock(s)
            await asyncio.to_thread(s.close)
        await coord.stop(grace=0.1)


# ---------------------------------------------------------------------------
# a drain's hold with a snapshot instead of a flush
# ---------------------------------------------------------------------------


def _hold_then_resume(snapshot: Any, *, flush: bool = False) -> tuple[RecordingLink, list[int], list[tuple]]:
    """A session given a hold asking for a snapshot (and its resume) at step 7; what it sent and flushed."""
    link = RecordingLink()
    flushed: list[int] = []
    events: list[tuple] = []

    def flusher(step: int, down: frozenset[int]) -> FlushResult:
        flushed.append(step)
        return FlushResult(step, 1000)

    session = ElasticSession(
        link, flush=flusher, snapshot=snapshot, on_event=lambda k, f: events.append((k, f)), report_interval=0.0
    )
    hold = trainer_pb2.Hold(generation=1, flush=flush, snapshot=True, down_slices=[3], reason="drain")
    resume = trainer_pb2.Resume(generation=1, active_slices=[0, 1, 2], source=trainer_pb2.Resume.MEMORY)
    link.inbox.extend([trainer_pb2.SidecarCommand(hold=hold), trainer_pb2.SidecarCommand(resume=resume)])
    d = session.step_boundary(7)
    assert d is not None and d.source == "memory" and d.down_slices == frozenset({3})
    return link, flushed, events


def test_a_snapshot_hold_keeps_the_step_in_memory_and_writes_nothing() -> None:
    kept: list[tuple[int, frozenset[int]]] = []
    link, flushed, events = _hold_then_resume(lambda step, leaving: kept.append((step, leaving)) or "")
    assert kept == [(7, frozenset({3}))] and flushed == []
    (held,) = [m.held for m in link.sent if m.HasField("held")]
    assert (held.step, held.flush_bytes, held.flush_error) == (7, 0, "")
    (ev,) = [f for k, f in events if k == "held"]
    assert ev["snapshot"] is True and ev["flush_bytes"] == 0


def test_a_trainer_that_cannot_keep_the_snapshot_flushes_instead_and_says_why() -> None:
    link, flushed, events = _hold_then_resume(lambda step, leaving: "no replica per slice")
    assert flushed == [7]
    (held,) = [m.held for m in link.sent if m.HasField("held")]
    assert held.flush_bytes == 1000 and held.committed_step == 7
    assert ("snapshot_unavailable", {"step": 7, "why": "no replica per slice", "then": "flush"}) in events


def test_a_trainer_without_a_snapshot_hook_flushes_a_snapshot_hold() -> None:
    link, flushed, events = _hold_then_resume(None)
    assert flushed == [7]
    assert any(k == "snapshot_unavailable" and "no in-memory snapshot" in f["why"] for k, f in events), events


# ---------------------------------------------------------------------------
# the next mesh prepared on the sidecar's advice
# ---------------------------------------------------------------------------


def _prepare_cmd(slices: list[int], generation: int = 1) -> trainer_pb2.SidecarCommand:
    return trainer_pb2.SidecarCommand(prepare=trainer_pb2.Prepare(generation=generation, active=slices, reason="r"))


def _resume_when_held(link: RecordingLink) -> None:
    """Answer the trainer's HeldAck as the coordinator does: resume generation 2 on slices 0, 2 and 3."""
    resume = trainer_pb2.Resume(generation=2, active_slices=[0, 2, 3], source=trainer_pb2.Resume.MEMORY)
    sent = link.send

    def answer(msg: trainer_pb2.TrainerMessage) -> None:
        sent(msg)
        if msg.HasField("held"):
            link.inbox.append(trainer_pb2.SidecarCommand(resume=resume))

    link.send = answer  # type: ignore[method-assign]


def _preparing_session(future: Any) -> tuple[RecordingLink, ElasticSession, list[tuple[int, ...]], list[tuple]]:
    """A session training on slices 0-3 at generation 1 whose prepare hook records its calls and returns ``future``."""
    link = RecordingLink()
    asked: list[tuple[int, ...]] = []
    events: list[tuple] = []
    session = ElasticSession(
        link,
        snapshot=lambda step, leaving: "",
        prepare=lambda slices: asked.append(slices) or future,
        on_event=lambda k, f: events.append((k, f)),
        report_interval=0.0,
    )
    session.generation, session.active_slices = 1, (0, 1, 2, 3)
    session.elastic_timeout_seconds = 5.0  # a test that goes wrong waits for no resume long
    return link, session, asked, events


def test_a_prepare_calls_the_hook_with_the_slices_and_goes_on_training() -> None:
    from concurrent.futures import Future

    done: Future[object] = Future()
    done.set_result(None)
    link, session, asked, events = _preparing_session(done)
    link.inbox.append(_prepare_cmd([3, 0, 2]))
    assert session.step_boundary(5) is None  # advice: no hold, nothing acknowledged
    assert asked == [(0, 2, 3)] and link.sent == []
    assert any(k == "prepare" and f["slices"] == [0, 2, 3] for k, f in events), events


def test_a_drain_from_memory_trains_on_while_the_next_mesh_is_built_then_holds() -> None:
    from concurrent.futures import Future

    building: Future[object] = Future()
    link, session, asked, events = _preparing_session(building)
    hold = trainer_pb2.Hold(generation=2, snapshot=True, down_slices=[1], reason="drain")
    link.inbox.extend([_prepare_cmd([0, 2, 3], 2), trainer_pb2.SidecarCommand(hold=hold)])
    assert session.step_boundary(5) is None and session.step_boundary(6) is None  # still building: train on
    assert not [m for m in link.sent if m.HasField("held")]
    assert any(k == "hold_deferred" and f["until"] == "prepared" for k, f in events), events
    building.set_result(None)
    _resume_when_held(link)
    d = session.step_boundary(7)  # built: the hold is carried out at this boundary
    assert d is not None and d.active_slices == (0, 2, 3)
    (held,) = [m.held for m in link.sent if m.HasField("held")]
    assert held.step == 7


class _Clock:
    """The session's monotonic clock, moved on by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def _held_at(
    monkeypatch: pytest.MonkeyPatch, hold: trainer_pb2.Hold, at: list[tuple[float, int]], resent_at: int = -1
) -> int | None:
    """The step at which a session building slices 0, 2 and 3 holds, its prepare begun at clock 0, when the step
    boundaries come at (seconds, step) ``at`` and ``hold`` (slice 1 leaves) at the first (again at ``resent_at``);
    None when it trains on through them all."""
    from concurrent.futures import Future

    import trainer_hooks.session as session_module

    clock = _Clock()
    monkeypatch.setattr(session_module, "time", clock)
    link, session, asked, events = _preparing_session(Future())
    link.inbox.append(_prepare_cmd([0, 2, 3], 2))
    assert session.step_boundary(1) is None
    _resume_when_held(link)
    for seconds, step in at:
        clock.now = 1000.0 + seconds
        if step in (at[0][1], resent_at):
            link.inbox.append(trainer_pb2.SidecarCommand(hold=hold))
        if session.step_boundary(step) is not None:
            (held,) = [m.held for m in link.sent if m.HasField("held")]
            return held.step
    return None


def test_a_hold_trains_on_for_the_prepare_as_long_as_it_says_from_its_arrival(monkeypatch: pytest.MonkeyPatch) -> None:
    # The hold comes 25 s after the prepare began: the wait counts from the hold.
    steps = [(25.0, 2), (45.0, 3), (54.0, 4), (56.0, 5)]
    hold = trainer_pb2.Hold(generation=2, snapshot=True, down_slices=[1], reason="r", prepare_wait_seconds=30.0)
    assert _held_at(monkeypatch, hold, steps) == 5
    hold.prepare_wait_seconds = 0.0  # a host already going: hold at once
    assert _held_at(monkeypatch, hold, steps) == 2


def test_a_hold_from_an_older_sidecar_waits_the_trainers_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer_hooks.session import PREPARE_HOLD_WAIT_SECONDS

    w = PREPARE_HOLD_WAIT_SECONDS
    steps = [(25.0, 2), (25.0 + w - 1, 3), (25.0 + w + 1, 4)]
    hold = trainer_pb2.Hold(generation=2, snapshot=True, down_slices=[1], reason="r")
    assert not hold.HasField("prepare_wait_seconds")
    assert _held_at(monkeypatch, hold, steps) == 4
    # The same hold sent again (a coordinator repeating it) keeps the time it first came.
    assert _held_at(monkeypatch, hold, steps, resent_at=3) == 4


def test_the_cores_prepare_wait_goes_on_the_wire_and_none_leaves_it_unset() -> None:
    from agent.core.model import HoldTrainer
    from agent.executors import trainer_command

    cmd = trainer_command(HoldTrainer(2, False, frozenset({1}), "r", True, 0.0))
    assert cmd is not None and cmd.hold.HasField("prepare_wait_seconds") and cmd.hold.prepare_wait_seconds == 0.0
    cmd = trainer_command(HoldTrainer(2, False, frozenset({1}), "r", True))
    assert cmd is not None and not cmd.hold.HasField("prepare_wait_seconds")


def test_a_hold_for_another_mesh_or_with_a_flush_does_not_wait_for_a_prepare() -> None:
    from concurrent.futures import Future

    for hold in (
        trainer_pb2.Hold(generation=2, snapshot=True, down_slices=[2], reason="another slice goes"),
        trainer_pb2.Hold(generation=2, flush=True, down_slices=[1], reason="a flush"),
    ):
        link, session, asked, events = _preparing_session(Future())
        resume = trainer_pb2.Resume(generation=2, active_slices=[0, 3], source=trainer_pb2.Resume.MEMORY)
        cmds = [_prepare_cmd([0, 2, 3], 2), trainer_pb2.SidecarCommand(hold=hold)]
        link.inbox.extend([*cmds, trainer_pb2.SidecarCommand(resume=resume)])
        assert session.step_boundary(5) is not None, hold
        assert [m.held.step for m in link.sent if m.HasField("held")] == [5]


def test_a_prepare_hook_that_fails_or_is_missing_never_stops_training() -> None:
    link, session, asked, events = _preparing_session(None)
    session._prepare = lambda slices: 1 / 0
    link.inbox.append(_prepare_cmd([0, 1]))
    assert session.step_boundary(5) is None
    assert any(k == "prepare_failed" and "ZeroDivisionError" in f["error"] for k, f in events), events
    bare = ElasticSession(RecordingLink(), on_event=lambda k, f: events.append((k, f)), report_interval=0.0)
    bare._link.inbox.append(_prepare_cmd([0, 1]))
    assert bare.step_boundary(5) is None
    assert any(k == "prepare_ignored" for k, f in events), events
