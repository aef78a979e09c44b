"""A recovery's phases as the coordinator's decisions show them: for the phase metric, the journal and the
admin ``events`` stream, which share the coordinator's one :class:`PhaseClock`."""

from __future__ import annotations

from agent.core.model import (
    Decision,
    Event,
    HoldTrainer,
    ResumeTrainer,
    State,
    TrainerHeld,
    TrainerResumed,
    TrainerStepped,
    WorkerLost,
)


class PhaseClock:
    """``detect`` (a lost host's silence before its loss was decided), ``hold`` (the hold decision until the
    trainer's held ack), ``wait`` (that ack until the decision to resume: waiting for enough slices),
    ``rebuild_restore`` (that decision until the trainer's resumed ack: it rebuilds its mesh and restores its
    state in between, reported as one sum), ``first_step`` (the resumed ack until the next step report),
    ``degraded`` (the first step on fewer slices than the job has until the hold that grows it back), and
    ``grow_hold``, ``grow_wait``, ``grow_rebuild_restore``, ``grow_first_step`` for that grow. The demo's
    summary splits rebuild from restore with the trainer's own marks (simjob/phases.py)."""

    def __init__(self) -> None:
        self._decided: float | None = None  # the hold decision of the recovery in progress
        self._held: float | None = None  # when its trainer acknowledged the hold
        self._resume: float | None = None  # when the resume was decided
        self._resumed: tuple[str, float] | None = None  # ("" or "grow_", when) until the next step report
        self._degraded_since: float | None = None

    def observe(self, ev: Event, d: Decision, before: State, now: float) -> dict[str, float]:
        """Advance the recovery in progress by one decision; the phases that ended with it (seconds)."""
        s = d.state
        out: dict[str, float] = {}
        if self._decided is None and any(isinstance(a, HoldTrainer) for a in d.actions):
            self._decided, self._held, self._resume = now, None, None
            if isinstance(ev, WorkerLost):
                out["detect"] = max(0.0, ev.silent_seconds)
        if self._decided is not None and any(isinstance(a, ResumeTrainer) for a in d.actions):
            self._resume = now
        match ev:
            case TrainerHeld() if self._decided is not None and self._held is None and ev.generation == s.generation:
                self._held = now
            case TrainerResumed() if self._decided is not None and ev.generation == s.generation:
                grow = "grow_" if before.active and len(ev.active) > len(before.active) else ""
                if grow and self._degraded_since is not None:
                    out["degraded"] = max(0.0, self._decided - self._degraded_since)
                    self._degraded_since = None
                held = self._held if self._held is not None else self._decided
                resume = max(held, self._resume if self._resume is not None else held)
                out[grow + "hold"] = held - self._decided
                out[grow + "wait"] = resume - held
                out[grow + "rebuild_restore"] = now - resume
                self._decided = self._held = self._resume = None
                self._resumed = (grow, now)
            case TrainerStepped() if self._resumed is not None:
                grow, resumed = self._resumed
                self._resumed = None
                out[grow + "first_step"] = max(0.0, now - resumed)
                if len(s.active) < s.policy.num_slices and self._degraded_since is None:
                    self._degraded_since = now
                elif len(s.active) >= s.policy.num_slices:
                    self._degraded_since = None
        return out
