"""The example trainers' periodic checkpoints, reported to the sidecar once Orbax committed them.

``CheckpointManager.save`` returns once the write has started; Orbax writes the step under a
temporary name and renames it when the background write is done (orbax.checkpoint
``CheckpointManager``: async saves, ``is_saving_in_progress()``, ``wait_until_finished()``). A
step counts as committed only once no save is in progress and the step is among the steps read
back from the directory, as the MaxText hook reports its periodic saves (``session.committed``).
"""

from __future__ import annotations

from typing import Any


class PeriodicCommits:
    def __init__(self, manager: Any, session: Any, events: Any = None) -> None:
        self.manager = manager
        self.session = session
        self.events = events
        self.pending: list[int] = []

    def started(self, step: int) -> None:
        """A periodic save of ``step`` was started."""
        self.pending.append(step)

    def poll(self) -> int | None:
        """Report the newest started save that Orbax has committed since; returns it (None: none yet)."""
        if not self.pending or self.manager.is_saving_in_progress():
            return None
        on_disk = set(self.manager.all_steps(read=True))
        done = [s for s in self.pending if s in on_disk]
        self.pending = []
        if not done:
            return None
        step = max(done)
        if self.session is not None:
            self.session.committed(step)
        if self.events is not None:
            self.events("checkpoint_committed", {"step": step})
        return step
