"""The example trainers report a periodic checkpoint once Orbax has finalized it, even when a save is
in progress at every step (saves slower than the checkpoint period: CI's slower machines)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import orbax.checkpoint as ocp

from simjob.commits import PeriodicCommits


class Session:
    def __init__(self) -> None:
        self.steps: list[int] = []

    def committed(self, step: int) -> None:
        self.steps.append(step)


def test_a_save_in_progress_does_not_hide_the_finished_one_before_it(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    session = Session()
    manager = ocp.CheckpointManager(
        tmp_path / "ck", options=ocp.CheckpointManagerOptions(max_to_keep=3, enable_async_checkpointing=True)
    )
    commits = PeriodicCommits(manager, session, lambda kind, fields: events.append((kind, fields)))
    state = {"w": np.arange(1 << 20, dtype=np.float32)}

    def save(step: int) -> None:
        manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))

    save(10)
    commits.started(10)
    # Hold the next save's background write open: its finalize waits for this gate, so the save
    # of step 20 stays in progress through every poll below.
    gate = threading.Event()
    real = manager._finalize  # the write's last stage, run on Orbax's background thread
    manager._finalize = lambda *a, **k: (gate.wait(30), real(*a, **k))[1]  # type: ignore[method-assign]
    try:
        save(20)  # Orbax's save waits for step 10's save to finish first
        commits.started(20)
        assert manager.is_saving_in_progress()
        assert session.steps == [10], "step 10 is finalized once the save of 20 has started"
        assert commits.poll() == 10
        assert commits.poll() is None, "each commit is returned once"
        assert 20 in manager.all_steps(), "the manager still tracks the save in progress"
        assert 20 not in ocp.path.step.checkpoint_steps(tmp_path / "ck"), "not finalized yet"
    finally:
        gate.set()
    manager.wait_until_finished()
    assert commits.poll() == 20
    assert session.steps == [10, 20]
    assert [f["step"] for k, f in events if k == "checkpoint_committed"] == [10, 20]
    manager.close()


def test_a_step_started_twice_is_reported_once(tmp_path: Path) -> None:
    """The trainers call ``started`` again for their last step when training ends (the save on the
    period may already have been that step): one commit, one report."""
    events: list[str] = []
    session = Session()
    manager = ocp.CheckpointManager(tmp_path / "ck", options=ocp.CheckpointManagerOptions(max_to_keep=3))
    commits = PeriodicCommits(manager, session, lambda kind, fields: events.append(kind))
    manager.save(20, args=ocp.args.Composite(state=ocp.args.StandardSave({"w": np.zeros(8)})))
    commits.started(20)
    manager.wait_until_finished()
    commits.started(20)
    assert commits.poll() == 20
    assert commits.poll() is None
    assert session.steps == [20] and events == ["checkpoint_committed"]
    manager.close()
