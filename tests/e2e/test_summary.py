"""The demo summary attributes each hold to the fault that caused it (journal and trainer events as written)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simjob.summary import FaultRecord, summarize


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
