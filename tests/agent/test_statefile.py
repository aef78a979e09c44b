"""The coordinator's state file: round trips, refusals, atomic writes, and a restart."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agent import statefile
from agent.config import CoordinatorConfig
from agent.coordinator import Coordinator
from agent.core.model import (
    HostRecord,
    Phase,
    Policy,
    State,
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

POLICY = Policy(num_slices=3, hosts_per_slice=2, elastic_timeout_seconds=30.0, rejoin_grace_seconds=7.0)
HOSTS = {(s, h): HostRecord(f"inc-{s}-{h}", registered_at=1.0) for s in range(3) for h in range(2)}


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


def roundtrip(tmp_path: Path, state: State, now: float = 1000.0) -> State:
    path = tmp_path / "state.json"
    statefile.write(path, state)
    return statefile.restore(path, initial_state(POLICY, now), now)


def test_snapshot_is_what_gets_written(tmp_path: Path) -> None:
    st = saved_state(Phase.RUNNING)
    path = tmp_path / "sub" / "state.json"  # the directory is created
    statefile.write(path, st)
    on_disk = json.loads(path.read_text())
    assert on_disk == statefile.snapshot(st)
    assert on_disk["version"] == statefile.VERSION
    assert on_disk["generation"] == 5
    assert on_disk["hosts"] == sorted([list(k) for k in HOSTS])


def test_running_restores_running_with_rejoin_grace(tmp_path: Path) -> None:
    r = roundtrip(tmp_path, saved_state(Phase.RUNNING), now=1000.0)
    assert r.phase == Phase.RUNNING
    assert r.generation == 5
    assert r.retries_used == 2
    assert r.active == frozenset({0, 2})
    assert r.expected_rejoin == frozenset(HOSTS)
    assert r.deadline == pytest.approx(1000.0 + POLICY.rejoin_grace_seconds)
    # Live membership is re-learnt, never restored.
    assert dict(r.hosts) == {}
    assert r.trainer.committed_step == 30
    assert r.trainer.last_step == 41
    assert not r.trainer.attached
    assert r.policy == POLICY


def test_running_includes_hosts_still_expected_and_drops_unknown_ones(tmp_path: Path) -> None:
    st = saved_state(
        Phase.RUNNING,
        hosts=_frozen({(0, 0): HOSTS[(0, 0)]}),
        expected_rejoin=frozenset({(1, 1), (9, 0), (0, 5)}),  # the last two are outside the policy
    )
    r = roundtrip(tmp_path, st)
    assert r.expected_rejoin == frozenset({(0, 0), (1, 1)})


@pytest.mark.parametrize("phase", [Phase.HOLDING, Phase.WAITING])
def test_holding_and_waiting_restore_as_holding(tmp_path: Path, phase: Phase) -> None:
    st = saved_state(phase, hold_flush=True, hold_reason="active slice(s) [1] down", hold_down=frozenset({1}))
    r = roundtrip(tmp_path, st, now=500.0)
    assert r.phase == Phase.HOLDING
    assert r.generation == 5
    assert r.retries_used == 2
    assert r.active == frozenset({0, 2})
    assert r.hold_flush is True
    assert r.hold_reason == "active slice(s) [1] down"
    assert r.hold_down == frozenset({1})
    assert r.deadline == pytest.approx(500.0 + POLICY.elastic_timeout_seconds)
    assert r.expected_rejoin == frozenset()
    assert r.trainer.committed_step == 30


@pytest.mark.parametrize("phase", [Phase.FAILED, Phase.COMPLETED, Phase.STARTING])
def test_terminal_or_starting_gives_a_fresh_state_keeping_the_generation(tmp_path: Path, phase: Phase) -> None:
    r = roundtrip(tmp_path, saved_state(phase, exit_code=42 if phase == Phase.FAILED else None), now=200.0)
    fresh = initial_state(POLICY, 200.0)
    assert r.phase == Phase.STARTING
    assert r.generation == 5  # never goes backwards
    assert r.active == frozenset()
    assert r.expected_rejoin == frozenset()
    assert r.deadline == fresh.deadline
    assert r.exit_code is None
    assert dict(r.hosts) == {} and r.hold_down == frozenset() and not r.hold_flush


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{not json", ["not valid JSON"]),
        ("", ["not valid JSON"]),
        (json.dumps({"version": 99, "phase": "running"}), ["version 99", "expected 1"]),
        (json.dumps({"phase": "running"}), ["version None"]),
        (json.dumps({"version": 1, "phase": "running"}), ["malformed"]),
        (
            json.dumps(
                {
                    "version": 1,
                    "phase": "bogus",
                    "hosts": [],
                    "committed_step": 0,
                    "last_step": 0,
                    "generation": 1,
                    "retries_used": 0,
                }
            ),
            ["malformed", "bogus"],
        ),
        (
            json.dumps(
                {
                    "version": 1,
                    "phase": "running",
                    "hosts": [[0]],
                    "committed_step": 0,
                    "last_step": 0,
                    "generation": 1,
                    "retries_used": 0,
                }
            ),
            ["malformed"],
        ),
        (
            json.dumps(
                {
                    "version": 1,
                    "phase": "running",
                    "hosts": [],
                    "committed_step": "x",
                    "last_step": 0,
                    "generation": 1,
                    "retries_used": 0,
                }
            ),
            ["malformed"],
        ),
    ],
    ids=["garbage", "empty", "wrong-version", "no-version", "missing-keys", "bad-phase", "bad-host", "bad-number"],
)
def test_bad_files_raise_statefileerror_naming_the_file(tmp_path: Path, content: str, words: list[str]) -> None:
    path = tmp_path / "coordinator-state.json"
    path.write_text(content)
    with pytest.raises(statefile.StateFileError) as ei:
        statefile.restore(path, initial_state(POLICY, 0.0), 0.0)
    msg = str(ei.value)
    assert str(path) in msg
    for w in words:
        assert w in msg, msg
    assert isinstance(ei.value, ValueError)


def test_write_leaves_no_temp_files_and_replaces_in_place(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    for g in range(1, 6):
        statefile.write(path, saved_state(Phase.RUNNING, generation=g))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    assert json.loads(path.read_text())["generation"] == 5


def test_a_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    # Big enough that a non-atomic write would be visible half-done.
    many = _frozen({(s, h): HostRecord(f"x{s}-{h}") for s in range(3) for h in range(2)})
    states = [
        saved_state(Phase.HOLDING, generation=g, hosts=many, hold_reason="r" * (1000 + 5000 * (g % 2)))
        for g in range(1, 200)
    ]
    statefile.write(path, states[0])
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
        for st in states:
            statefile.write(path, st)
    finally:
        stop.set()
        t.join()
    assert not errors, errors[:3]
    assert seen and seen == sorted(seen)  # generations only ever go up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


@pytest.mark.parametrize("failing", ["replace", "fsync"])
def test_a_failed_write_keeps_the_old_file_and_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = tmp_path / "state.json"
    statefile.write(path, saved_state(Phase.RUNNING, generation=3))
    before = path.read_bytes()

    def boom(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(statefile.os, failing, boom)
    with pytest.raises(OSError, match="No space left"):
        statefile.write(path, saved_state(Phase.RUNNING, generation=4))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


# ---------------------------------------------------------------------------
# a coordinator restart
# ---------------------------------------------------------------------------


def coordinator_config(state_file: Path, journal: Path | None = None) -> CoordinatorConfig:
    return CoordinatorConfig(
        job="restart-job",
        listen="127.0.0.1:0",
        policy=Policy(num_slices=2, rejoin_grace_seconds=10.0),
        heartbeat_interval=0.25,
        heartbeat_timeout=1.2,
        state_file=state_file,
        journal=journal,
        log_format="json",
        log_level="warning",
    )


async def test_coordinator_restart_resumes_running_and_never_lowers_the_generation(tmp_path: Path) -> None:
    path = tmp_path / "state" / "coordinator.json"
    journal = tmp_path / "journal.jsonl"
    coord = Coordinator(coordinator_config(path, journal))
    await coord.start()
    try:
        now = time.monotonic
        coord.apply(WorkerJoined(0, 0, "a"), now())
        coord.apply(WorkerJoined(1, 0, "b"), now())
        d = coord.apply(TrainerAttached(0, -1, frozenset()), now())
        assert d.state.phase == Phase.RUNNING and d.state.generation == 1
        coord.apply(TrainerResumed(1, 0, frozenset({0, 1}), "fresh"), now())
        coord.apply(TrainerStepped(12, 1), now())
        d = coord.apply(WorkerLost(1, 0, "b", "stream_closed"), now())
        assert d.state.phase == Phase.HOLDING and d.state.generation == 2
        assert json.loads(path.read_text())["phase"] == "holding"  # every change is persisted at once
        coord.apply(TrainerHeld(2, 12, 10), now())
        d = coord.apply(WorkerJoined(1, 0, "b2"), now())
        assert d.state.phase == Phase.RUNNING and d.state.generation == 2
        before = coord.state
    finally:
        await coord.stop(grace=0.1)

    on_disk = json.loads(path.read_text())
    assert (on_disk["phase"], on_disk["generation"]) == ("running", 2)
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    assert journal.exists() and len(journal.read_text().splitlines()) >= 7

    t0 = time.monotonic()
    again = Coordinator(coordinator_config(path))
    await again.start()
    try:
        st = again.state
        assert st.generation == before.generation == 2
        assert st.phase == Phase.RUNNING
        assert st.active == frozenset({0, 1})
        assert st.expected_rejoin == frozenset({(0, 0), (1, 0)})
        assert dict(st.hosts) == {}
        assert st.retries_used == before.retries_used == 1
        assert st.trainer.committed_step == 10
        assert st.trainer.last_step == 12
        assert st.deadline is not None and t0 + 10.0 <= st.deadline <= time.monotonic() + 10.0
        # A known host re-registering is no longer expected; nothing else changes.
        d = again.apply(WorkerJoined(0, 0, "a"), time.monotonic())
        assert d.state.expected_rejoin == frozenset({(1, 0)})
        assert d.state.phase == Phase.RUNNING and d.state.generation == 2
        assert not d.actions
    finally:
        await again.stop(grace=0.1)
    assert json.loads(path.read_text())["generation"] == 2


async def test_coordinator_refuses_to_start_on_a_corrupt_state_file(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.json"
    path.write_text('{"version": 1, "phase": "running"')
    coord = Coordinator(coordinator_config(path))
    with pytest.raises(statefile.StateFileError, match=str(path)):
        await coord.start()
    assert coord.server is None  # nothing started listening


def test_write_is_a_rename_over_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.json"
    calls: list[tuple[str, str]] = []
    real = os.replace

    def spy(src: str, dst: str) -> None:
        calls.append((str(src), str(dst)))
        real(src, dst)

    monkeypatch.setattr(statefile.os, "replace", spy)
    statefile.write(path, saved_state(Phase.RUNNING))
    assert len(calls) == 1
    src, dst = calls[0]
    assert dst == str(path)
    assert Path(src).parent == tmp_path and Path(src).name.startswith("state.json.") and src.endswith(".tmp")
