"""The outcomes every rule of the core ends in: hold, resume or fail.

Also the one multi-controller rule, :func:`cannot_shrink`, that every loss path asks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace as _replace
from typing import Any

from agent.constants import EXIT_RESTART
from agent.core.model import (
    AbortTrainer,
    Decision,
    ExitCoordinator,
    HoldTrainer,
    Phase,
    ResumeSource,
    ResumeTrainer,
    State,
    TellWorkers,
    TrainerView,
)

CANNOT_SHRINK = "; a multi-controller job cannot continue without it: restart (the JobSet restarts on 42)"


def replace(obj: Any, _slices: Iterable[int] | None = None, **changes: Any) -> Any:
    """:func:`dataclasses.replace`; a new State carries its parent's up slices over
    (:meth:`State.carry_up`), ``_slices`` naming the slices whose hosts changed."""
    new = _replace(obj, **changes)
    if isinstance(obj, State):
        new.carry_up(obj, _slices)
    return new


def fmt(slices: frozenset[int] | set[int]) -> str:
    return "[" + ",".join(str(s) for s in sorted(slices)) + "]"


def cannot_shrink(state: State) -> bool:
    """Whether losing a slice without notice must restart the whole job.

    A multi-controller job (one JAX process per host, joined by ``jax.distributed``) needs every
    slice: the survivors of an unannounced loss are blocked in a collective, with nothing to hold
    or flush. The JobSet restarts it on exit 42 from the newest committed checkpoint.
    """
    return state.policy.multi_controller


def restart(state: State, why: str) -> Decision:
    """Fail a job that :func:`cannot_shrink` with exit 42, saying why."""
    return fail(state, why + CANNOT_SHRINK)


def draining(state: State) -> frozenset[int]:
    return frozenset(state.drains)


def rejoining_slices(state: State, now: float) -> frozenset[int]:
    """Slices with a host still awaited by a restarted coordinator within its rejoin grace."""
    if state.rejoin_deadline is None or now >= state.rejoin_deadline:
        return frozenset()
    return state.expected_rejoin.slices()


def start_hold(
    state: State,
    now: float,
    why: str,
    *,
    failure: bool,
    flush: bool | None = None,
    snapshot: bool = False,
    prepare_wait: float | None = None,
) -> Decision:
    """Hold the trainer at its step boundary under a new generation; a failure spends a retry.

    ``snapshot``: a drain from memory (:func:`agent.core.drains.drain_hold`): the trainer makes its newest
    in-memory snapshot the held step's instead of flushing, training on first at most ``prepare_wait``
    seconds for the next mesh's program."""
    p = state.policy
    retries = state.retries_used
    if failure:
        if retries >= p.max_recoveries:
            return fail(state, f"{why}; elastic_max_retries={p.elastic_max_retries} recoveries used up")
        retries += 1
    up = state.up_slices()
    # Flush unless training can continue at once on the survivors from memory.
    can_continue = len(up) >= p.min_slices and bool(up)
    if flush is None:
        in_hold = state.phase in (Phase.HOLDING, Phase.WAITING)
        flush = (failure or in_hold) and not can_continue
    gen = state.generation + 1
    # Slices whose hosts have yet to rejoin a restarted coordinator are not known
    # to be down: naming them would make the trainer drop their replicas (and,
    # with none left, rewind to its checkpoint); it skips lost ones itself.
    down = p.all_slices - up - rejoining_slices(state, now)
    snapshot = snapshot and not flush
    prepare_wait = prepare_wait if snapshot else None
    # A trainer that cannot keep a snapshot on the slices that remain flushes instead: same bound.
    ack_within = p.elastic_timeout_seconds + (p.flush_timeout_seconds if flush or snapshot else 0.0)
    new = replace(
        state,
        phase=Phase.HOLDING,
        generation=gen,
        retries_used=retries,
        deadline=now + ack_within,
        hold_flush=flush,
        hold_snapshot=snapshot,
        hold_prepare_wait=prepare_wait,
        hold_reason=why,
        hold_down=down,
    )
    note = f" (recovery {retries} of {p.max_recoveries})" if failure else ""
    return Decision(
        new,
        (HoldTrainer(gen, flush, down, why, snapshot, prepare_wait), TellWorkers(gen, "hold", why)),
        f"{why}; hold generation {gen}{' with flush' if flush else ''}{' with snapshot' if snapshot else ''}{note}",
    )


def resume(state: State, up: frozenset[int], why: str) -> Decision:
    """Resume (or start) training on exactly ``up``."""
    t = state.trainer
    src = source(t, up)
    gen = state.generation if state.phase != Phase.STARTING else state.generation + 1
    trainer = replace(t, active=up, surviving=up, resume_pending=True, held=False)
    new = replace(state, phase=Phase.RUNNING, generation=gen, active=up, deadline=None, trainer=trainer)
    return Decision(
        new,
        (ResumeTrainer(gen, up, src, why), TellWorkers(gen, "resume", why)),
        f"{why}; resume generation {gen} on {fmt(up)} from {src}",
    )


def source(t: TrainerView, up: frozenset[int]) -> ResumeSource:
    """Memory when the trainer still holds replicas on a slice it resumes on, else the checkpoint."""
    from_memory = t.step_in_memory >= 0 and bool(t.surviving & up)
    return ResumeSource.MEMORY if from_memory else ResumeSource.CHECKPOINT


def fail(state: State, why: str, exit_code: int = EXIT_RESTART) -> Decision:
    """End the job: the trainer aborts (after flushing) and the coordinator exits with ``exit_code``."""
    new = replace(state, phase=Phase.FAILED, deadline=None, exit_code=exit_code)
    then = "restart from the last committed checkpoint" if exit_code == EXIT_RESTART else "stop"
    return Decision(
        new,
        (
            AbortTrainer(state.generation, why, exit_code),
            TellWorkers(state.generation, "abort", why),
            ExitCoordinator(exit_code, why),
        ),
        f"{why}; aborting with exit code {exit_code} ({then})",
    )
