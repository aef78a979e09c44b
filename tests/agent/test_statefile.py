"""The coordinator's state file: what survives a restart, refusals, atomic writes, write-ahead, fencing.

Pure round trips first (snapshot -> file -> restore), then real coordinators
on loopback restarted on the same state directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from agent.config import CoordinatorConfig
from agent.coordinator import Coordinator
from agent.core.model import (
    Drain,
    HostRecord,
    OperatorCommand,
    Phase,
    Policy,
    State,
    Tick,
    TrainerAttached,
    TrainerHeld,
    TrainerResumed,
    TrainerStepped,
    TrainerView,
    WorkerJoined,
    WorkerLost,
    _frozen,
    initial_state,
)
from agent.durable import statefile
from agent.servers.status import coordinator_readiness, readiness_reasons
from protos.elastic_sidecar.v1 import peer_pb2, peer_pb2_grpc, trainer_pb2, trainer_pb2_grpc
from tests.agent.coordinators import coordinator_config as shared_config

REPO = Path(__file__).resolve().parents[2]
POLICY = Policy(num_slices=3, hosts_per_slice=2, elastic_timeout_seconds=30.0, rejoin_grace_seconds=7.0)
HOSTS = {(s, h): HostRecord(f"inc-{s}-{h}", registered_at=1.0, settled=True) for s in range(3) for h in range(2)}
OFFSET = 1_700_000_000.0
"""Decision clock -> wall clock, fixed so that round trips are exact."""


def saved_state(phase: Phase, **kw: object) -> State:
    base = State(
        policy=POLICY,
        phase=phase,
        generation=5,
        active=frozenset({0, 2}),
        hosts=_frozen(HOSTS),
        retries_used=2,
        deadline=123.0,
        trainer=TrainerView(attached=True, generation=5, step_in_memory=40, last_step=41, committed_step=30),
    )
    return replace(base, **kw)


def roundtrip(tmp_path: Path, state: State, now: float = 1000.0, attempt: int = 0, saved_attempt: int = 0) -> State:
    path = tmp_path / "state.json"
    statefile.write(path, statefile.snapshot(state, epoch=7, restart_attempt=saved_attempt, offset=OFFSET))
    raw = statefile.read(path)
    r = statefile.restore(raw, initial_state(POLICY, now), now, restart_attempt=attempt, offset=OFFSET)
    assert r.epoch == 7
    return r.state


def test_running_restores_running_with_its_hosts_on_a_rejoin_grace(tmp_path: Path) -> None:
    r = roundtrip(tmp_path, saved_state(Phase.RUNNING), now=1000.0)
    assert r.phase == Phase.RUNNING and r.generation == 5 and r.retries_used == 2
    assert r.active == frozenset({0, 2})
    assert r.expected_rejoin == frozenset(HOSTS)
    assert r.rejoin_deadline == pytest.approx(1000.0 + POLICY.rejoin_grace_seconds)
    # The node map and incarnations come back, so the same process re-registering is known.
    assert {k: v.incarnation for k, v in r.hosts.items()} == {k: v.incarnation for k, v in HOSTS.items()}
    assert r.hosts[(0, 0)].registered_at == pytest.approx(1.0)
    assert r.trainer.committed_step == 30 and r.trainer.last_step == 41 and r.trainer.step_in_memory == 40
    assert not r.trainer.attached and r.trainer.detached_since == 1000.0
    assert r.policy == POLICY


def test_everything_that_carries_intent_survives(tmp_path: Path) -> None:
    drain = Drain(
        since=50.0, kind="terminate_on_host_maintenance", source="pubsub", reason="r", deadline=90.0, node="n"
    )
    later = Drain(
        since=5000.0,
        kind="upcomingMaintenance",
        source="pubsub",
        reason="w",
        node="m",
        starts_at=5120.0,
        ends_at=8720.0,
    )
    # A straggler drain whose replacement (--straggler-replace) has not gone out yet.
    straggler = Drain(since=70.0, kind="straggler", source="straggler", reason="s", replace=True)
    st = saved_state(
        Phase.WAITING,
        operator_hold=True,
        drains=_frozen({1: drain, 0: straggler}),
        planned=_frozen({2: later}),
        slice_errors=_frozen({2: 60.0}),
        notice_times=_frozen({"node-a": 1234.5}),
        hold_flush=True,
        hold_reason="why",
        hold_down=frozenset({1}),
        trainer=TrainerView(step_in_memory=40, committed_step=30, resume_pending=True, surviving=frozenset({0})),
        policy=replace(POLICY, elastic_min_slice_count=2, elastic_max_retries=4),
    )
    r = roundtrip(tmp_path, st, now=500.0)
    assert r.phase == Phase.WAITING and r.operator_hold
    assert r.deadline == pytest.approx(500.0 + POLICY.elastic_timeout_seconds)
    assert dict(r.drains) == {1: drain, 0: straggler}
    assert dict(r.planned) == {2: later}  # a window a week ahead is not forgotten
    assert dict(r.slice_errors) == {2: pytest.approx(60.0)}
    assert dict(r.notice_times) == {"node-a": 1234.5}
    assert (r.hold_flush, r.hold_reason, r.hold_down) == (True, "why", frozenset({1}))
    assert r.trainer.resume_pending and r.trainer.surviving == frozenset({0})
    assert r.policy.elastic_min_slice_count == 2 and r.policy.elastic_max_retries == 4  # adopted settings kept


def test_holding_restores_its_hold_with_a_fresh_deadline_and_grace(tmp_path: Path) -> None:
    st = saved_state(Phase.HOLDING, hold_flush=True, hold_reason="active slice(s) [1] down", hold_down=frozenset({1}))
    r = roundtrip(tmp_path, st, now=500.0)
    assert r.phase == Phase.HOLDING and r.generation == 5
    assert r.hold_flush and r.hold_down == frozenset({1})
    assert r.deadline == pytest.approx(500.0 + POLICY.elastic_timeout_seconds + POLICY.flush_timeout_seconds)
    assert r.expected_rejoin == frozenset(HOSTS)


def test_a_pending_drain_from_memory_keeps_its_prepare_wait(tmp_path: Path) -> None:
    st = saved_state(Phase.HOLDING, hold_snapshot=True, hold_prepare_wait=15.0, hold_down=frozenset({1}))
    r = roundtrip(tmp_path, st, now=500.0)
    assert r.hold_snapshot and r.hold_prepare_wait == 15.0
    assert roundtrip(tmp_path, saved_state(Phase.HOLDING, hold_snapshot=True), now=500.0).hold_prepare_wait is None


def test_failed_stays_failed_in_the_same_restart_attempt(tmp_path: Path) -> None:
    r = roundtrip(tmp_path, saved_state(Phase.FAILED, exit_code=42), now=200.0, attempt=3, saved_attempt=3)
    assert r.phase == Phase.FAILED and r.exit_code == 42 and r.retries_used == 2


@pytest.mark.parametrize("phase", [Phase.FAILED, Phase.COMPLETED])
def test_a_new_restart_attempt_starts_fresh_keeping_generation_and_commit(tmp_path: Path, phase: Phase) -> None:
    r = roundtrip(tmp_path, saved_state(phase, exit_code=42), now=200.0, attempt=1, saved_attempt=0)
    assert r.phase == Phase.STARTING and r.generation == 5 and r.retries_used == 0
    assert r.trainer.committed_step == 30 and r.exit_code is None
    assert r.deadline == initial_state(POLICY, 200.0).deadline


def test_version_1_files_are_still_read(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    v1 = {
        "version": 1,
        "phase": "running",
        "generation": 4,
        "active": [0, 1],
        "retries_used": 1,
        "hosts": [[0, 0], [1, 1]],
        "committed_step": 9,
        "last_step": 11,
        "hold_flush": False,
        "hold_reason": "",
        "hold_down": [],
    }
    path.write_text(json.dumps(v1))
    r = statefile.restore(statefile.read(path), initial_state(POLICY, 10.0), 10.0).state
    assert r.phase == Phase.RUNNING and r.generation == 4 and r.retries_used == 1
    assert r.expected_rejoin == frozenset({(0, 0), (1, 1)}) and r.trainer.committed_step == 9


def _read_back(raw: bytes) -> dict:
    got = json.loads(raw)
    got.pop("written_at")
    return got


def _expected(state: State, offset: float) -> dict:
    want = json.loads(json.dumps(statefile.snapshot(state, offset=offset)))
    want.pop("written_at")
    return want


_KEYS = hs.tuples(hs.integers(0, 2), hs.integers(0, 1))
_RECORDS = hs.builds(
    HostRecord,
    hs.sampled_from(["a", "b", "c"]),
    node=hs.sampled_from(["", "n1", "n2"]),
    registered_at=hs.sampled_from([1.0, 2.5]),
    healthy=hs.booleans(),
    settled=hs.booleans(),
    away_since=hs.sampled_from([None, 3.0]),
)


@settings(max_examples=settings.default.max_examples // 5, deadline=None)
@given(
    steps=hs.lists(
        hs.tuples(
            hs.sampled_from(["put", "drop", "keep"]),
            _KEYS,
            _RECORDS,
            hs.frozensets(_KEYS, max_size=6),
            hs.booleans(),
        ),
        min_size=1,
        max_size=16,
    )
)
def test_the_renderer_writes_what_snapshot_holds_as_hosts_come_change_and_go(steps: list) -> None:
    """One renderer over a run of states (its cached lines reused) writes exactly snapshot()'s dict each time,
    whether it wrote every state or several changes (hosts added and gone) came between two writes."""
    renderer = statefile.Renderer()
    hosts = dict(HOSTS)
    state = saved_state(Phase.RUNNING)
    for op, key, record, expected, written in steps:
        if op == "put":
            hosts[key] = record  # a new object under a known key too: it must be rendered again
        elif op == "drop":
            hosts.pop(key, None)
        state = replace(state, hosts=_frozen(hosts), expected_rejoin=expected)
        if not written:
            continue
        raw = renderer.render(state, epoch=3, offset=OFFSET)
        assert _read_back(raw) == {**_expected(state, OFFSET), "epoch": 3}


def test_a_record_replaced_under_the_same_key_is_written_anew() -> None:
    renderer = statefile.Renderer()
    state = saved_state(Phase.RUNNING)
    renderer.render(state, offset=OFFSET)
    sick = replace(HOSTS[(1, 0)], healthy=False, incarnation="inc-new")
    later = replace(state, hosts=_frozen({**HOSTS, (1, 0): sick}))
    rows = {(r["slice"], r["host"]): r for r in json.loads(renderer.render(later, offset=OFFSET))["hosts"]}
    assert rows[(1, 0)]["healthy"] is False and rows[(1, 0)]["incarnation"] == "inc-new"
    assert rows[(0, 0)]["healthy"] is True


def test_a_wall_clock_that_drifted_renders_every_host_on_the_new_offset(tmp_path: Path) -> None:
    """Every time in one file is on one offset (``_rebase`` relies on it), cached lines included."""
    renderer = statefile.Renderer()
    state = saved_state(Phase.RUNNING)
    renderer.render(state, offset=OFFSET)
    near = json.loads(renderer.render(state, offset=OFFSET + statefile.OFFSET_TOLERANCE_SECONDS / 2))
    assert near["hosts"][0]["registered_at"] == pytest.approx(1.0 + OFFSET)  # within tolerance: the first offset
    stepped = json.loads(renderer.render(state, offset=OFFSET + 3600.0))
    assert [r["registered_at"] for r in stepped["hosts"]] == [pytest.approx(1.0 + OFFSET + 3600.0)] * len(HOSTS)
    assert stepped["written_at"] == pytest.approx(time.monotonic() + OFFSET + 3600.0, abs=1.0)
    path = tmp_path / "state.json"
    statefile.write(path, renderer.render(state, epoch=7, offset=OFFSET + 3600.0))
    r = statefile.restore(statefile.read(path), initial_state(POLICY, 50.0), 50.0, offset=OFFSET + 3600.0)
    assert r.state.hosts[(0, 0)].registered_at == pytest.approx(1.0) and r.epoch == 7


def test_hosts_awaited_after_a_restart_are_written_once_and_all_awaited_again(tmp_path: Path) -> None:
    """The awaited hosts on record are not written twice (10,000 of them after a restart); a restore awaits
    every host on record and the others written."""
    hosts = {k: v for k, v in HOSTS.items() if k != (2, 1)}
    st = saved_state(Phase.RUNNING, hosts=_frozen(hosts), expected_rejoin=frozenset({(0, 0), (1, 1), (2, 1)}))
    snap = statefile.snapshot(st, offset=OFFSET)
    assert snap["expected_rejoin"] == [[2, 1]]
    r = roundtrip(tmp_path, st, now=100.0)
    assert r.expected_rejoin == frozenset(HOSTS)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{not json", ["cannot be read"]),
        ("", ["cannot be read"]),
        ("[1, 2]", ["expected a JSON object"]),
        (json.dumps({"version": 99, "phase": "running"}), ["version 99", "reads 1 and 2"]),
        (json.dumps({"phase": "running"}), ["version None"]),
    ],
    ids=["garbage", "empty", "list", "newer-version", "no-version"],
)
def test_unreadable_files_raise_statefileerror_naming_the_file(tmp_path: Path, content: str, words: list[str]) -> None:
    path = tmp_path / "coordinator-state.json"
    path.write_text(content)
    with pytest.raises(statefile.StateFileError) as ei:
        statefile.read(path)
    msg = str(ei.value)
    assert str(path) in msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize(
    "broken",
    [{"phase": "bogus"}, {"generation": "x"}, {"hosts": [{"slice": 0}]}, {"drains": {"0": {"kind": "k"}}}],
    ids=["bad-phase", "bad-number", "bad-host", "bad-drain"],
)
def test_malformed_content_is_a_statefileerror(tmp_path: Path, broken: dict) -> None:
    raw = {**statefile.snapshot(saved_state(Phase.RUNNING), offset=OFFSET), **broken}
    with pytest.raises(statefile.StateFileError, match="malformed"):
        statefile.restore(raw, initial_state(POLICY, 0.0), 0.0, offset=OFFSET)


def test_intent_changed_ignores_step_counts_and_sees_everything_else() -> None:
    a = saved_state(Phase.RUNNING)
    assert not statefile.intent_changed(a, replace(a, trainer=replace(a.trainer, last_step=99, last_step_at=5.0)))
    assert statefile.intent_changed(a, replace(a, operator_hold=True))
    assert statefile.intent_changed(a, replace(a, trainer=replace(a.trainer, resume_pending=True)))
    assert statefile.intent_changed(a, replace(a, drains=_frozen({0: Drain(1.0, "k", "s", "r")})))


def test_write_leaves_no_temp_files_and_replaces_in_place(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    for g in range(1, 6):
        statefile.write(path, statefile.snapshot(saved_state(Phase.RUNNING, generation=g)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    assert json.loads(path.read_text())["generation"] == 5


def test_a_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    many = _frozen({(s, h): HostRecord(f"x{s}-{h}") for s in range(3) for h in range(2)})
    snaps = [
        statefile.snapshot(
            saved_state(Phase.HOLDING, generation=g, hosts=many, hold_reason="r" * (1000 + 5000 * (g % 2)))
        )
        for g in range(1, 200)
    ]
    statefile.write(path, snaps[0])
    stop = threading.Event()
    seen: list[int] = []
    errors: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            text = path.read_text()
            try:
                seen.append(json.loads(text)["generation"])
            except (json.JSONDecodeError, KeyError) as e:
                errors.append(f"{e!r}: {len(text)} bytes")

    t = threading.Thread(target=reader)
    t.start()
    try:
        for snap in snaps:
            statefile.write(path, snap)
    finally:
        stop.set()
        t.join()
    assert not errors, errors[:3]
    assert seen and seen == sorted(seen)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


@pytest.mark.parametrize("failing", ["replace", "fsync"])
def test_a_failed_write_keeps_the_old_file_and_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = tmp_path / "state.json"
    statefile.write(path, statefile.snapshot(saved_state(Phase.RUNNING, generation=3)))
    before = path.read_bytes()

    def boom(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(statefile.os, failing, boom)
    with pytest.raises(OSError, match="No space left"):
        statefile.write(path, statefile.snapshot(saved_state(Phase.RUNNING, generation=4)))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


# ---------------------------------------------------------------------------
# real coordinators on one state directory
# ---------------------------------------------------------------------------


def coordinator_config(state_dir: Path, **kw: object) -> CoordinatorConfig:
    args: dict = dict(state_file=state_dir / "state.json", journal=state_dir / "journal.jsonl", state_dir=state_dir)
    args.update(kw)
    policy = args.pop("policy", Policy(num_slices=2, rejoin_grace_seconds=10.0, settle_seconds=0.0))
    return shared_config("restart-job", policy, **args)


async def test_coordinator_restart_resumes_running_and_never_lowers_the_generation(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    coord = Coordinator(coordinator_config(state_dir))
    await coord.start()
    first_epoch = coord.epoch
    try:
        await coord.request(WorkerJoined(0, 0, "a"))
        await coord.request(WorkerJoined(1, 0, "b"))
        d = await coord.request(TrainerAttached(0, -1, frozenset()))
        assert d.state.phase == Phase.RUNNING and d.state.generation == 1
        await coord.request(TrainerResumed(1, 0, frozenset({0, 1}), "fresh"))
        await coord.request(TrainerStepped(12, 1))
        d = await coord.request(WorkerLost(1, 0, "b", "stream_closed"))
        assert d.state.phase == Phase.HOLDING and d.state.generation == 2
        on_disk = json.loads((state_dir / "state.json").read_text())
        assert on_disk["phase"] == "holding"  # written before the hold went out
        await coord.request(TrainerHeld(2, 12, 10))
        d = await coord.request(WorkerJoined(1, 0, "b2"))
        assert d.state.phase == Phase.RUNNING and d.state.generation == 2
        d = await coord.request(OperatorCommand("hold", "look at the loss curve"))
        before = coord.state
    finally:
        await coord.stop(grace=0.1)

    on_disk = json.loads((state_dir / "state.json").read_text())
    assert (on_disk["phase"], on_disk["epoch"]) == ("holding", first_epoch)
    assert len((state_dir / "journal.jsonl").read_text().splitlines()) >= 7

    again = Coordinator(coordinator_config(state_dir))
    await again.start()
    try:
        assert again.epoch > first_epoch
        st = again.state
        assert st.generation == before.generation
        assert st.phase == Phase.HOLDING and st.operator_hold  # the operator's hold is not forgotten
        assert st.expected_rejoin == frozenset({(0, 0), (1, 0)})
        assert st.retries_used == before.retries_used == 1
        assert st.trainer.committed_step == 10
        # A known host re-registering with its incarnation is no longer expected.
        d = await again.request(WorkerJoined(0, 0, "a"))
        assert d.state.expected_rejoin == frozenset({(1, 0)})
        assert json.loads((state_dir / "state.json").read_text())["epoch"] == again.epoch
    finally:
        await again.stop(grace=0.1)


async def test_a_corrupt_state_file_is_moved_aside_and_the_coordinator_starts(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "state.json").write_text('{"version": 2, "phase": "running"')
    coord = Coordinator(coordinator_config(state_dir))
    await coord.start()
    try:
        assert coord.state.phase == Phase.STARTING
        assert "cannot be read" in coord.state_file_note
        aside = [p.name for p in state_dir.iterdir() if ".unreadable-" in p.name]
        assert len(aside) == 1
        assert json.loads((state_dir / "state.json").read_text())["epoch"] == coord.epoch
    finally:
        await coord.stop(grace=0.1)


async def test_a_second_coordinator_on_the_same_state_dir_waits_for_the_lock(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    first = Coordinator(coordinator_config(state_dir))
    await first.start()
    second = Coordinator(coordinator_config(state_dir))
    starting = asyncio.create_task(second.start())
    try:
        await asyncio.sleep(1.2)
        assert not starting.done() and second.server is None  # it waits; it does not steer
        await first.stop(grace=0.1)
        await asyncio.wait_for(starting, 5)
        assert second.epoch > first.epoch
    finally:
        await first.stop(grace=0.1)
        if starting.done():
            await second.stop(grace=0.1)
        else:
            starting.cancel()


async def test_writes_failing_hold_actions_until_the_bound_then_act_and_catch_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state_dir = tmp_path / "state"
    coord = Coordinator(coordinator_config(state_dir, durability_bound=0.6))
    await coord.start()
    sent: list[str] = []
    real_execute = coord._execute

    def spy(a):  # noqa: ANN001
        sent.append(type(a).__name__)
        real_execute(a)

    coord._execute = spy  # type: ignore[method-assign]
    try:
        await coord.request(WorkerJoined(0, 0, "a"))
        await coord.request(WorkerJoined(1, 0, "b"))
        real_write = statefile.write
        failing = {"on": True}

        def write(path: Path, data: dict) -> None:
            if failing["on"]:
                raise OSError(28, "No space left on device")
            real_write(path, data)

        monkeypatch.setattr(statefile, "write", write)
        t0 = time.monotonic()
        d = await coord.request(TrainerAttached(0, -1, frozenset()))
        waited = time.monotonic() - t0
        assert "ResumeTrainer" in sent and waited >= 0.5  # carried out only after the bound
        assert d.state.phase == Phase.RUNNING
        assert not coord.durable and "No space left" in coord.durability_problem
        assert coordinator_readiness(coord)["state_durable"] is False
        assert json.loads((state_dir / "state.json").read_text())["phase"] == "starting"  # the file is behind
        failing["on"] = False
        for _ in range(50):
            await asyncio.sleep(0.1)
            if coord.durable:
                break
        assert coord.durable and coordinator_readiness(coord)["state_durable"]
        assert json.loads((state_dir / "state.json").read_text())["phase"] == "running"
    finally:
        await coord.stop(grace=0.1)


async def test_a_hung_write_fails_after_its_bound_and_blocks_further_writes_until_it_returns() -> None:
    writer = statefile.BoundedWriter()
    release = threading.Event()
    calls: list[int] = []

    def stuck(n: int) -> None:
        calls.append(n)
        release.wait(30)

    t0 = time.monotonic()
    with pytest.raises(statefile.WriteHung, match="did not return within 0.3 s"):
        await writer.run(stuck, 1, bound=0.3)
    assert 0.25 <= time.monotonic() - t0 < 5
    assert writer.hung_for > 0
    # Still hung: the next write fails at once and starts nothing (no pile-up behind the disk).
    t0 = time.monotonic()
    with pytest.raises(statefile.WriteHung, match="earlier state write has not returned"):
        await writer.run(stuck, 2, bound=5.0)
    assert time.monotonic() - t0 < 0.5 and calls == [1]
    release.set()
    for _ in range(100):
        if writer.hung_for == 0.0:
            break
        await asyncio.sleep(0.02)
    assert writer.hung_for == 0.0
    done: list[int] = []
    await writer.run(done.append, 3, bound=5.0)
    assert done == [3] and calls == [1]

    def broken() -> None:
        raise OSError(30, "Read-only file system")

    with pytest.raises(OSError, match="Read-only"):
        await writer.run(broken, bound=5.0)
    await writer.run(done.append, 4, bound=5.0)  # a failed write leaves nothing outstanding
    assert done == [3, 4]


async def test_a_hung_state_write_is_a_failed_one_the_hold_goes_out_and_readiness_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stalled disk (the state file's write blocks in fsync, injected here): after --durability-bound
    the decision is carried out from memory, flagged not durable, and the loop keeps deciding."""
    state_dir = tmp_path / "state"
    coord = Coordinator(coordinator_config(state_dir, durability_bound=0.6))
    await coord.start()
    sent: list[str] = []
    real_execute = coord._execute

    def spy(a):  # noqa: ANN001
        sent.append(type(a).__name__)
        real_execute(a)

    coord._execute = spy  # type: ignore[method-assign]
    release = threading.Event()
    real_write = statefile.write
    hung = {"on": False, "calls": 0}

    def write(path: Path, data: dict) -> None:
        if hung["on"]:
            hung["calls"] += 1
            release.wait(60)  # what an fsync on a stalled disk does
        real_write(path, data)

    try:
        await coord.request(WorkerJoined(0, 0, "a"))
        await coord.request(WorkerJoined(1, 0, "b"))
        await coord.request(TrainerAttached(0, -1, frozenset()))
        await coord.request(TrainerResumed(1, 0, frozenset({0, 1}), "fresh"))
        monkeypatch.setattr(statefile, "write", write)
        hung["on"] = True
        t0 = time.monotonic()
        d = await asyncio.wait_for(coord.request(WorkerLost(1, 0, "b", "stream_closed")), 10)
        waited = time.monotonic() - t0
        print(f"\n[state] hung state write: the hold was carried out after {waited:.2f} s (--durability-bound 0.6)")
        assert d.state.phase == Phase.HOLDING and "HoldTrainer" in sent
        assert 0.5 <= waited < 5, waited  # bounded: carried out after --durability-bound
        assert not coord.durable and "stalled disk" in coord.durability_problem
        assert coordinator_readiness(coord)["state_durable"] is False
        assert coord.metrics.state_durable._value.get() == 0  # noqa: SLF001
        # The loop still decides, at once: no new write starts behind the hung one.
        t0 = time.monotonic()
        await asyncio.wait_for(coord.request(TrainerHeld(2, 0, -1)), 10)
        await asyncio.wait_for(coord.request(WorkerJoined(1, 0, "b2")), 10)
        assert time.monotonic() - t0 < 1.0
        assert hung["calls"] == 1
        assert json.loads((state_dir / "state.json").read_text())["phase"] == "running"  # the file is behind
        # The disk comes back: the next write catches the file up.
        release.set()
        for _ in range(50):
            coord.submit(Tick())
            await asyncio.sleep(0.1)
            if coord.durable:
                break
        assert coord.durable and coordinator_readiness(coord)["state_durable"]
        assert json.loads((state_dir / "state.json").read_text())["generation"] == coord.state.generation
    finally:
        release.set()
        await coord.stop(grace=0.1)


async def test_participants_with_a_newer_epoch_fence_the_older_coordinator(tmp_path: Path) -> None:
    from agent.durable import fencing

    earlier = Coordinator(coordinator_config(tmp_path / "state"))  # leaves a state file: not a blind start
    await earlier.start()
    await earlier.stop(grace=0.1)
    coord = Coordinator(coordinator_config(tmp_path / "state"))
    await coord.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{coord.port}") as ch:
            call = peer_pb2_grpc.PeerStub(ch).Join()
            ident = peer_pb2.HostIdentity(slice=0, host=0, incarnation="w")
            newer, proof = coord.epoch + 5, fencing.proof(None, "restart-job", coord.epoch + 5, "newer")
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await call.write(
                    peer_pb2.WorkerMessage(
                        register=peer_pb2.Register(
                            identity=ident,
                            job="restart-job",
                            epoch_seen=newer,
                            epoch_seen_coordinator="newer",
                            epoch_seen_proof=proof,
                        )
                    )
                )
                await call.read()
            assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"superseded by epoch {coord.epoch + 5}" in (ei.value.details() or "")
        assert coord.fenced_by == coord.epoch + 5 and coordinator_readiness(coord)["not_fenced"] is False
        async with grpc.aio.insecure_channel(f"127.0.0.1:{coord.trainer_port}") as ch:
            call = trainer_pb2_grpc.TrainerLinkStub(ch).Attach()
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await call.write(trainer_pb2.TrainerMessage(hello=trainer_pb2.TrainerHello(job="restart-job")))
                await call.read()
            assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        await coord.stop(grace=0.1)


async def test_the_trainer_link_is_not_on_the_peer_port_and_checks_its_token(tmp_path: Path) -> None:
    from agent.auth import BearerToken

    coord = Coordinator(coordinator_config(tmp_path / "state", trainer_token=BearerToken("s3cret", "test")))
    await coord.start()
    try:
        hello = trainer_pb2.TrainerMessage(hello=trainer_pb2.TrainerHello(job="restart-job"))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{coord.port}") as ch:
            # Refused before any message is read: the call only reads its status. Writing first races
            # the refusal, and grpc-aio then reports a failed write as INTERNAL instead (seen once).
            call = trainer_pb2_grpc.TrainerLinkStub(ch).Attach()
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await asyncio.wait_for(call.read(), 10)
            assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED
        async with grpc.aio.insecure_channel(f"127.0.0.1:{coord.trainer_port}") as ch:
            call = trainer_pb2_grpc.TrainerLinkStub(ch).Attach()
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await asyncio.wait_for(call.read(), 10)
            assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with grpc.aio.insecure_channel(f"127.0.0.1:{coord.trainer_port}") as ch:
            call = trainer_pb2_grpc.TrainerLinkStub(ch).Attach(metadata=(("authorization", "Bearer s3cret"),))
            await call.write(hello)
            for _ in range(50):
                if coord.state.trainer.attached:
                    break
                await asyncio.sleep(0.05)
            assert coord.state.trainer.attached
            call.cancel()
    finally:
        await coord.stop(grace=0.1)


def test_write_is_a_rename_over_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.json"
    calls: list[tuple[str, str]] = []
    real = os.replace

    def spy(src: str, dst: str) -> None:
        calls.append((str(src), str(dst)))
        real(src, dst)

    monkeypatch.setattr(statefile.os, "replace", spy)
    statefile.write(path, statefile.snapshot(saved_state(Phase.RUNNING)))
    assert len(calls) == 1
    src, dst = calls[0]
    assert dst == str(path)
    assert Path(src).parent == tmp_path and Path(src).name.startswith("state.json.") and src.endswith(".tmp")


# ---------------------------------------------------------------------------
# a broken state directory, a wedged decision loop
# ---------------------------------------------------------------------------


def _mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, timeout=30)
    return r.returncode == 0


@contextlib.contextmanager
def broken_state_dir(tmp_path: Path, how: str) -> Iterator[Path]:
    """A state directory that cannot be written: ``read-only`` (a read-only tmpfs as root, where chmod does
    not stop writes; else chattr +i; else chmod as another user), ``missing`` (under a regular file, so it
    cannot be made), or ``full`` (a tiny tmpfs filled up; root only)."""
    d = tmp_path / "state"
    undo: list[list[str]] = []
    if how == "missing":
        (tmp_path / "a-file").write_text("not a directory\n")
        yield tmp_path / "a-file" / "state"
        return
    if how == "full":
        if os.geteuid() != 0 or not _mount_tmpfs(d, "size=64k"):
            pytest.skip("a full disk needs a tmpfs mount (root)")
        undo.append(["umount", str(d)])
        with contextlib.suppress(OSError), open(d / "filler", "wb") as f:
            f.write(b"\0" * (1 << 20))
    elif os.geteuid() == 0:
        if _mount_tmpfs(d, "ro,size=64k"):
            undo.append(["umount", str(d)])
        else:
            d.mkdir(parents=True, exist_ok=True)
            r = subprocess.run(["chattr", "+i", str(d)], capture_output=True, timeout=30)
            assert r.returncode == 0, f"as root, neither a read-only tmpfs nor chattr +i works here: {r.stderr!r}"
            undo.append(["chattr", "-i", str(d)])
    else:
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o555)
    try:
        with pytest.raises(OSError):
            (d / "probe").write_text("x")  # the directory really refuses writes
        yield d
    finally:
        for cmd in undo:
            subprocess.run(cmd, capture_output=True, timeout=30)
        if d.exists() and not undo:
            d.chmod(0o755)


@pytest.mark.parametrize("how", ["read-only", "missing", "full"])
def test_a_broken_state_directory_means_running_without_durability_loudly(tmp_path: Path, how: str) -> None:
    """Not a crash loop: the coordinator process serves on, with an ERROR, state_durable 0 and /readyz
    saying why; SIGTERM still ends it with 0."""
    from simjob.ports import free_port

    http = free_port()
    with broken_state_dir(tmp_path, how) as state_dir:
        argv = [
            sys.executable,
            "-m",
            "agent",
            "coordinator",
            "--num-slices",
            "2",
            "--listen",
            f"127.0.0.1:{free_port()}",
        ]
        argv += [
            "--trainer-listen",
            f"127.0.0.1:{free_port()}",
            "--http-listen",
            f"127.0.0.1:{http}",
            "--admin-listen",
            "none",
            "--state-dir",
            str(state_dir),
        ]
        p = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("ES_")}, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: list[dict] = []
        try:
            assert p.stdout is not None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                line = p.stdout.readline()
                assert line, f"the coordinator exited ({p.wait()}): {p.stderr.read() if p.stderr else ''}"
                lines.append(json.loads(line))
                if lines[-1]["message"] == "coordinator listening":
                    break
            time.sleep(0.5)
            assert p.poll() is None, "the coordinator exited"
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10) as r:
                metrics = r.read().decode()
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http}/readyz", timeout=10)
                raise AssertionError("/readyz said ready")
            except urllib.error.HTTPError as e:
                assert e.code == 503
                ready = json.loads(e.read())
            p.send_signal(signal.SIGTERM)
            out, _ = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    lines += [json.loads(line) for line in out.splitlines()]
    print(f"\n[state dir {how}] /readyz: {ready}")
    assert p.returncode == 0
    assert ready["checks"]["state_durable"] is False and ready["checks"]["grpc"] is True
    assert str(state_dir) in ready["reasons"]["state_durable"]
    assert "elastic_sidecar_state_durable 0.0" in metrics
    errors = [rec["message"] for rec in lines if rec["severity"] == "ERROR"]
    assert any("WITHOUT durability" in m or "cannot make decisions durable" in m for m in errors), errors
    assert not any(rec["message"] == "coordinator could not start" for rec in lines)


async def test_a_wedged_decision_loop_is_not_ready_and_not_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop awaits something that never returns: readiness and gRPC health (the liveness probe's)
    say so, and serve again once it moves."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    import agent.loop_watch as loop_watch_module

    monkeypatch.setattr(loop_watch_module, "DECISIONS_WEDGED_SECONDS", 1.0)
    coord = Coordinator(coordinator_config(tmp_path / "state", durability_bound=0.2))
    await coord.start()
    gate = asyncio.Event()
    real = coord._make_durable

    async def stuck() -> None:
        await gate.wait()
        await real()

    async def health() -> int:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{coord.port}") as ch:
            reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            return reply.status

    try:
        assert await health() == health_pb2.HealthCheckResponse.SERVING and coordinator_readiness(coord)["deciding"]
        coord._make_durable = stuck  # type: ignore[method-assign]
        coord.submit(WorkerJoined(0, 0, "a"))  # a write is due: the loop waits in stuck()
        for _ in range(100):
            await asyncio.sleep(0.1)
            if coord.decisions_wedged:
                break
        assert coordinator_readiness(coord)["deciding"] is False
        assert "wedged" in readiness_reasons(coord)["deciding"]
        await asyncio.sleep(0.1)
        assert await health() == health_pb2.HealthCheckResponse.NOT_SERVING
        gate.set()
        for _ in range(100):
            await asyncio.sleep(0.1)
            if not coord.decisions_wedged:
                break
        assert coordinator_readiness(coord)["deciding"] is True
        await asyncio.sleep(0.1)
        assert await health() == health_pb2.HealthCheckResponse.SERVING
        assert (0, 0) in coord.state.hosts
    finally:
        gate.set()
        await coord.stop(grace=0.1)


def test_a_slice_the_trainer_named_stays_marked_across_a_restart(tmp_path: Path) -> None:
    st = saved_state(Phase.WAITING, slice_errors=_frozen({1: 60.0}), trainer_errors=_frozen({1: 55.0}))
    r = roundtrip(tmp_path, st, now=500.0)
    assert dict(r.trainer_errors) == {1: pytest.approx(55.0)}
    assert statefile.intent_changed(st, replace(st, trainer_errors=_frozen({})))
