"""The demo summary attributes each hold to the fault that caused it (journal and trainer events as written)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simjob.summary import FaultRecord, failure_recoveries, summarize


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _rec(t: float, trigger: str, up: list[int], *actions: str) -> dict[str, Any]:
    return {"time": t, "trigger": trigger, "up_slices": up, "actions": [{"type": a} for a in actions], "reason": ""}


def test_a_fault_absorbed_without_a_hold_does_not_borrow_the_next_faults_hold(tmp_path: Path) -> None:
    # A worker sidecar restarted at t=1 (the slice never went down), host 1.0 killed at t=5.
    _write(
        tmp_path / "journal.jsonl",
        [
            _rec(1.2, "WorkerJoined", [0, 1]),
            _rec(5.1, "WorkerLost", [0], "HoldTrainer"),
            _rec(5.2, "TrainerHeld", [0], "ResumeTrainer"),
        ],
    )
    steps = [{"t": 0.5 + 0.5 * i, "kind": "step", "step": i + 1, "seconds": 0.5, "slices": [0, 1]} for i in range(10)]
    events = [*steps, {"t": 5.25, "kind": "resumed", "from_step": 10, "slices": [0], "restored_from": "memory"}]
    events.append({"t": 5.5, "kind": "step", "step": 11, "seconds": 0.2, "slices": [0]})
    _write(tmp_path / "trainer-events.jsonl", events)
    faults = [
        FaultRecord("sidecar-restart", 1, 0, 2, 1.0, 2),
        FaultRecord("kill", 1, 0, 9, 5.0, 9),
    ]
    out = summarize(tmp_path, faults, 0.0, 6.0, {"trainer": 0, "coordinator": 0})
    restart, kill = out["faults"]
    assert restart["detection_seconds"] is None and restart["hold_seconds"] is None
    assert restart["slices_after"] is None
    assert kill["detection_seconds"] == 0.1 and kill["hold_seconds"] == 0.1 and kill["lost_steps"] == 0


def test_a_hold_decided_again_after_the_coordinator_died_before_its_state_write_counts_once() -> None:
    # As in a CI run of the fault matrix: the coordinator journalled hold 2 and was SIGKILLed
    # while writing its state file; its successor, back at generation 1, decided hold 2 again.
    # A second failure later is a second recovery.
    journal = [
        {"reason": "host 1.0 lost; hold generation 2 with flush (recovery 1 of 10)", "operation": "recovery-2"},
        {"reason": "trainer attached (generation 1, step 6); waiting for 4 host(s) to rejoin"},
        {
            "reason": "host 1.0 replaced live incarnation; hold generation 2 with flush (recovery 1 of 10)",
            "operation": "recovery-2",
        },
        {"reason": "trainer held at step 7", "operation": "recovery-2"},
        {"reason": "host 2.0 lost; hold generation 3 (recovery 2 of 10)", "operation": "recovery-3"},
    ]
    assert failure_recoveries(journal, None, {"retries_used": 2}) == (2, "status", 2)
    # Lines without an operation (older journals) count one each.
    bare = [{"reason": r["reason"]} for r in journal]
    assert failure_recoveries(bare, None, None) == (None, None, 3)
