"""A recovery split into phases from a recorded journal and trainer event log (no processes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simjob.phases import GROW, PHASES, SHRINK, recovery_phases
from simjob.summary import FaultRecord, render, summarize


def _hold(t: float, trigger: str, up: list[int]) -> dict[str, Any]:
    return {"time": t, "trigger": trigger, "up_slices": up, "actions": [{"type": "HoldTrainer"}], "reason": ""}


def _resume(t: float, trigger: str, up: list[int]) -> dict[str, Any]:
    return {"time": t, "trigger": trigger, "up_slices": up, "actions": [{"type": "ResumeTrainer"}], "reason": ""}


def _resumed(t: float, slices: list[int], directive: float, ready: float, restored: float, **kw: Any) -> dict[str, Any]:
    return {
        "t": t,
        "kind": "resumed",
        "from_step": kw.pop("from_step", 10),
        "slices": slices,
        "restored_from": "memory",
        "restore_source": "live",
        "restore_bytes": 4096,
        "directive_t": directive,
        "program_ready_t": ready,
        "restored_t": restored,
        **kw,
    }


def _step(t: float, step: int, slices: list[int]) -> dict[str, Any]:
    return {"t": t, "kind": "step", "step": step, "seconds": 0.1, "slices": slices}


# Slice 1 of two killed at t=10 after step 10; the coordinator decides the hold at 10.5, the trainer
# holds at 10.75, gets the resume at 11, compiles until 12, restores until 12.25, steps at 12.5; slice 1
# is back, the grow is decided at 20, held at 20.25, resumed at 20.5, ready at 21, restored at 21.5,
# the first step on both slices done at 22.
JOURNAL = [
    _hold(10.5, "WorkerLost", [0]),
    _resume(10.8, "TrainerHeld", [0]),
    _hold(20.0, "Tick", [0, 1]),
    _resume(20.3, "TrainerHeld", [0, 1]),
]
SHRUNK = _resumed(12.3, [0], 11.0, 12.0, 12.25)
GROWN = _resumed(21.6, [0, 1], 20.5, 21.0, 21.5, from_step=25)
EVENTS = [
    _resumed(0.5, [0, 1], 0.2, 0.3, 0.4, from_step=0),
    *(_step(float(i), i, [0, 1]) for i in range(1, 11)),
    {"t": 10.75, "kind": "held", "generation": 2, "step": 10},
    SHRUNK,
    _step(12.5, 11, [0]),
    *(_step(12.5 + 0.5 * i, 11 + i, [0]) for i in range(1, 15)),
    {"t": 20.25, "kind": "held", "generation": 3, "step": 25},
    GROWN,
    _step(22.0, 26, [0, 1]),
]


def test_each_phase_runs_from_one_mark_to_the_next_and_they_add_up() -> None:
    out = recovery_phases(10.0, 10.5, SHRUNK, GROWN, shrunk=True, journal=JOURNAL, tev=EVENTS)
    assert out == {
        "detect": 0.5,
        "hold": 0.25,
        "wait": 0.25,
        "rebuild": 1.0,
        "restore": 0.25,
        "first_step": 0.25,
        "degraded": 7.5,
        "grow_hold": 0.25,
        "grow_wait": 0.25,
        "grow_rebuild": 0.5,
        "grow_restore": 0.5,
        "grow_first_step": 0.5,
        "total": 12.0,
    }
    assert sum(out[p] for p in PHASES) == pytest.approx(out["total"])


def test_a_job_that_never_grew_back_has_no_grow_phases_and_no_total() -> None:
    out = recovery_phases(10.0, 10.5, SHRUNK, None, shrunk=True, journal=JOURNAL, tev=EVENTS)
    assert all(out[p] is not None for p in SHRINK)
    assert all(out[p] is None for p in GROW) and out["total"] is None


def test_a_recovery_back_at_full_size_has_nothing_degraded() -> None:
    full = _resumed(12.3, [0, 1], 11.0, 12.0, 12.25)
    out = recovery_phases(10.0, 10.5, full, None, shrunk=False, journal=JOURNAL, tev=EVENTS)
    assert out["degraded"] == 0.0 and out["total"] == 2.5


def test_a_trainer_held_before_the_decision_counts_zero_hold_never_negative() -> None:
    # The trainer's step failed and it stopped (held) before the coordinator's decision was journalled.
    events = [e if e["kind"] != "held" or e["t"] > 11 else {**e, "t": 10.4} for e in EVENTS]
    out = recovery_phases(10.0, 10.5, SHRUNK, None, shrunk=True, journal=JOURNAL, tev=events)
    assert out["hold"] == 0.0 and out["wait"] == 0.5


def test_a_missing_mark_leaves_its_two_phases_unknown() -> None:
    no_compile_mark = {k: v for k, v in SHRUNK.items() if k != "program_ready_t"}
    out = recovery_phases(10.0, 10.5, no_compile_mark, None, shrunk=True, journal=JOURNAL, tev=EVENTS)
    assert out["rebuild"] is None and out["restore"] is None
    assert out["wait"] == 0.25 and out["first_step"] == 0.25


def test_the_summary_gives_each_fault_its_phases_restores_and_a_table_defining_each_column(tmp_path: Path) -> None:
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(j) + "\n" for j in JOURNAL))
    (tmp_path / "trainer-events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    out = summarize(tmp_path, [FaultRecord("kill", 1, 0, 10, 10.0, 10)], 0.0, 23.0, {"trainer": 0})
    (f,) = out["faults"]
    assert f["phases"]["rebuild"] == 1.0 and f["phases"]["grow_rebuild"] == 0.5 and f["phases"]["total"] == 12.0
    assert f["phase_restores"]["recovery"] == {"source": "live", "bytes": 4096}
    assert f["grow_slices"] == [1, 2] and f["grow_lost_steps"] == 0
    # Start-up until the first resume; training from there to the last step.
    assert out["startup_seconds"] == 0.5 and out["training_seconds"] == 21.5
    text = render(out, 0.0, tmp_path, timeline=False)
    for column in ("detect", "degraded", "hold", "wait", "rebuild", "restore", "first", "lost"):
        assert any(line.strip().startswith(column + " ") for line in text.splitlines()), column
