"""The example trainers' periodic checkpoints, reported to the sidecar once Orbax committed them.

``CheckpointManager.save`` returns once the write has started; Orbax writes the step under a
temporary name and renames it when the background write is done (orbax.checkpoint
``CheckpointManager``: async saves, ``is_saving_in_progress()``, ``wait_until_finished()``). A
step counts as committed only once Orbax's own test finds its directory finalized
(``orbax.checkpoint.path.step.is_checkpoint_finalized``; the managers here use Orbax's standard step
names), as the MaxText hook reports its periodic saves (``session.committed``).

A save can take longer than a checkpoint period (a slow disk, a busy host): then a save is in
progress at every step, and waiting for a moment with none would report nothing until training
ends. So the pending steps' directories are also checked while one is in progress (at most every
``POLL_SECONDS``, the MaxText hook's period; about 1 ms for each pending step here), whenever the
next save has started (Orbax's ``save`` first waits for the previous save to finish), and once no
save is in progress. The manager's own step list is never reloaded for this: ``all_steps(read=True)``
would replace it, dropping a save in progress.
"""

from __future__ import annotations

import time
from typing import Any

POLL_SECONDS = 1.0


class PeriodicCommits:
    def __init__(self, manager: Any, session: Any, events: Any = None) -> None:
        self.manager = manager
        self.session = session
        self.events = events
        self.pending: list[int] = []
        self._unreturned: int | None = None
        self._newest = -1  # the newest step reported
        self._read_at = float("-inf")

    def started(self, step: int) -> None:
        """A periodic save of ``step`` was started (``save`` returned, so the saves before it have finished)."""
        if self.pending:
            self._collect(self._finalized())
        if step > self._newest and step not in self.pending:  # a final save of a step already started is one save
            self.pending.append(step)

    def poll(self) -> int | None:
        """The newest started save found committed since the last poll, reported to the sidecar (None: none)."""
        if self.pending:
            if not self.manager.is_saving_in_progress():
                self._collect(self._finalized())
                self.pending = []  # none in progress: a step still missing failed and never commits
            elif time.monotonic() - self._read_at >= POLL_SECONDS:
                self._collect(self._finalized())
        step, self._unreturned = self._unreturned, None
        return step

    def _finalized(self) -> set[int]:
        """The pending steps whose directories Orbax has finalized."""
        from orbax.checkpoint import path as ocp_path

        self._read_at = time.monotonic()
        fmt = ocp_path.step.standard_name_format()
        done: set[int] = set()
        for step in self.pending:
            p = ocp_path.step.build_step_path(self.manager.directory, fmt, step)
            if p.exists() and ocp_path.step.is_checkpoint_finalized(p):
                done.add(step)
        return done

    def _collect(self, on_disk: set[int]) -> None:
        done = [s for s in self.pending if s in on_disk]
        if not done:
            return
        step = max(done)
        self.pending = [s for s in self.pending if s > step]
        self._newest = step
        if self.session is not None:
            self.session.committed(step)
        if self.events is not None:
            self.events("checkpoint_committed", {"step": step})
        self._unreturned = step
