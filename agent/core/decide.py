"""The pure decision core: ``decide(state, event, now) -> Decision``.

No I/O, no clock, no randomness, after torchft's ``quorum_compute``: each edge case is a unit
test of a few lines, and the ``reason`` goes straight into logs. This module dispatches; the rules
live by topic (workers, trainer, notices, operator, evaluate) and in docs/design.md,
"The decision core".

States and transitions::

                 all slices up + trainer attached
    STARTING ──────────────────────────────────────────► RUNNING ◄─────────┐
       │ deadline passed, too few slices                 │  │              │
       ▼                                                 │  │ a slice of   │ enough slices
     FAILED ◄── retries exhausted ───────────────────────┘  │ `active` goes│ up (resume on
       ▲                                                    │ down, or a   │ exactly them)
       │ ack deadline passed           ┌────────────────────┘ slice comes  │
       │                               ▼                      back (grow)  │
       ├─────────────────────────── HOLDING ── HeldAck ──► WAITING ────────┘
       │                                                     │
       └──────────────── deadline passed, too few slices ────┘

    RUNNING ── TrainerFinished ──► COMPLETED

Invariants:

* ``generation`` never decreases; every hold starts a new one, and its resume carries it.
* Only a host actually lost is a failure; a notice, a grow or a re-synchronisation spends no retry.
* An observation about an older registration of a host is stale and dropped.
* Nothing waits for ever: every phase but RUNNING has a deadline, and RUNNING judges a hang.
* A job that cannot shrink (multi-controller) restarts on an unannounced loss:
  :func:`agent.core.transitions.cannot_shrink`.
"""

from __future__ import annotations

from agent.constants import EXIT_RESTART
from agent.core.drains import MC_NOTICE_EXIT_MARGIN, NOTICE_STALE_SECONDS
from agent.core.evaluate import evaluate
from agent.core.model import (
    AbortTrainer,
    Decision,
    Event,
    NodeNotice,
    OperatorCommand,
    Phase,
    State,
    StragglerVerdict,
    Tick,
    TrainerAttached,
    TrainerDetached,
    TrainerFinished,
    TrainerFlushed,
    TrainerHeld,
    TrainerResumed,
    TrainerSliceError,
    TrainerStepped,
    WorkerAway,
    WorkerHealth,
    WorkerJoined,
    WorkerLost,
)
from agent.core.notices import node_notice
from agent.core.operator import operator
from agent.core.stragglers import straggler_verdict
from agent.core.trainer import (
    trainer_attached,
    trainer_detached,
    trainer_finished,
    trainer_flushed,
    trainer_held,
    trainer_resumed,
    trainer_slice_error,
    trainer_stepped,
)
from agent.core.transitions import replace, start_hold
from agent.core.workers import worker_away, worker_health, worker_joined, worker_lost

__all__ = ["MC_NOTICE_EXIT_MARGIN", "NOTICE_STALE_SECONDS", "decide"]

_HANDLERS = {
    WorkerJoined: worker_joined,
    WorkerLost: worker_lost,
    WorkerAway: worker_away,
    WorkerHealth: worker_health,
    TrainerAttached: trainer_attached,
    TrainerDetached: trainer_detached,
    TrainerStepped: trainer_stepped,
    TrainerSliceError: trainer_slice_error,
    TrainerHeld: trainer_held,
    TrainerResumed: trainer_resumed,
    TrainerFlushed: trainer_flushed,
    TrainerFinished: trainer_finished,
    NodeNotice: node_notice,
    OperatorCommand: operator,
    StragglerVerdict: straggler_verdict,
}
_WORKER_EVENTS = (WorkerJoined, WorkerLost, WorkerAway, WorkerHealth)


def decide(state: State, event: Event, now: float) -> Decision:
    """Turn one event into the next state, the actions to take and why."""
    if state.phase == Phase.FAILED and isinstance(event, TrainerAttached):
        # A trainer that attaches late must learn the job failed, or it would wait for a start forever.
        code = state.exit_code if state.exit_code is not None else EXIT_RESTART
        why = f"job failed; telling the trainer that attached to abort with exit code {code}"
        return Decision(state, (AbortTrainer(state.generation, why, code),), why)
    if state.phase.terminal and not isinstance(event, _WORKER_EVENTS):
        why = f"job is {state.phase}; {type(event).__name__} ignored"
        return Decision(state, (), why, rejected=why if isinstance(event, OperatorCommand) else "")
    ahead = getattr(event, "generation", -1)
    if ahead <= state.generation:
        return _dispatch(state, event, now)
    # The trainer acted on a newer generation than ours: an earlier coordinator process (restarted
    # without its state file) sent it. It ignores older commands, so carry on above it: a fresh
    # start simply starts above it; a running job re-synchronises with a hold.
    if state.phase == Phase.STARTING:
        return _dispatch(replace(state, generation=ahead), event, now)
    d = _dispatch(state, event, now)
    if d.state.phase.terminal:
        return d
    behind = replace(d.state, generation=max(d.state.generation, ahead))
    why = f"{d.reason}; the trainer is at generation {ahead}, ahead of this coordinator, re-synchronising"
    return start_hold(behind, now, why, failure=False)


def _dispatch(state: State, event: Event, now: float) -> Decision:
    if isinstance(event, Tick):
        return evaluate(state, now, "")
    handler = _HANDLERS.get(type(event))
    if handler is None:
        raise TypeError(f"decide() got an unknown event {event!r}")
    return handler(state, event, now)  # type: ignore[operator]
