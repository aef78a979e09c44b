"""Writes the state file under the write-ahead rule: retried, bounded in time, and past
``--durability-bound`` carried on without durability, loudly, rather than leaving the job unprotected."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from agent import log as logmod
from agent.core.model import State
from agent.durable import statefile
from agent.metrics import Metrics

log = logmod.get("coordinator")


class StateWriter:
    """The coordinator's state file: what is on disk, and whether decisions are durable right now."""

    def __init__(
        self, path: Path | None, bound: float, restart_attempt: int, metrics: Metrics, epoch: Callable[[], int]
    ) -> None:
        self.path = path
        self.bound = bound
        self.restart_attempt = restart_attempt
        self.metrics = metrics
        self._epoch = epoch
        self.persisted: State | None = None
        """The newest state on disk (None: nothing written yet)."""
        self.durable = True
        """Every decision so far reached the state file before its actions ran."""
        self.problem = ""
        """Why decisions are not durable now (empty while they are)."""
        self._writer = statefile.BoundedWriter()
        self._renderer = statefile.Renderer()  # used only inside the writer's one-at-a-time writes

    def unusable(self, problem: str) -> None:
        """A broken state directory (read-only, missing, full): run on, without durability and loudly
        (ERROR, state_durable 0, /readyz with the reason); exiting would be a crash loop, the job unprotected."""
        log.error(
            "state directory unusable; running WITHOUT durability (a restart now would forget decisions) and "
            "retrying the state file at every decision",
            error=problem,
        )
        self.durable = False
        self.problem = problem
        self.metrics.state_durable.set(0)

    def due(self, state: State) -> bool:
        """A write is due when the decision changed intent, or while the file is behind (each event retries it)."""
        if self.path is None:
            return False
        if self.persisted is None or not self.durable:
            return True
        return statefile.intent_changed(self.persisted, state)

    def _write(self, state: State) -> None:
        """Serialise and write ``state`` (runs in a thread: states are immutable)."""
        assert self.path is not None
        pieces = self._renderer.chunks(state, epoch=self._epoch(), restart_attempt=self.restart_attempt)
        statefile.write(self.path, pieces)

    async def write(self, target: State) -> None:
        """Write ``target`` before its actions run; retried until ``bound``, then carried on without durability."""
        path = self.path
        if path is None:
            return
        deadline = time.monotonic() + (self.bound if self.durable else 0.0)
        delay = 0.05
        while True:
            try:
                # Bounded: a write that hangs (a stalled disk) fails like any other (statefile.BoundedWriter).
                bound = max(deadline - time.monotonic(), 0.25) if self.durable else self.bound
                await self._writer.run(self._write, target, bound=bound)
            except OSError as e:
                self.metrics.state_write_failures.inc()
                problem = f"state file {path}: {e.strerror or e}"
                if time.monotonic() >= deadline:
                    self._gave_up(problem)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            self.persisted = target
            if not self.durable:
                log.warning("state file writable again; decisions are durable", state_file=str(path))
                self.durable = True
                self.problem = ""
                self.metrics.state_durable.set(1)
            return

    def _gave_up(self, problem: str) -> None:
        if self.durable:
            log.error(
                "cannot make decisions durable; carrying them out from memory and retrying the state "
                "file (a restart now would forget decisions since the last good write)",
                error=problem,
                bound_seconds=self.bound,
            )
        self.durable = False
        self.problem = problem
        self.metrics.state_durable.set(0)
