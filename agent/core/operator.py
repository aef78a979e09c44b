"""Operator commands: hold, resume, drain, undrain, checkpoint, abort.

A command that cannot apply is refused with a reason naming what blocks it.
"""

from __future__ import annotations

from agent.constants import EXIT_ABORTED, EXIT_RESTART
from agent.core.evaluate import evaluate
from agent.core.model import Decision, Drain, FlushTrainer, HoldTrainer, OperatorCommand, Phase, State, _frozen
from agent.core.transitions import fail, replace, start_hold


def operator(state: State, ev: OperatorCommand, now: float) -> Decision:
    why = f"operator {ev.kind}: {ev.reason}"
    match ev.kind:
        case "hold":
            return _hold(state, now, why)
        case "resume":
            return _resume(state, now, why)
        case "drain":
            return _drain(state, ev, now, why)
        case "undrain":
            return _undrain(state, ev, now, why)
        case "checkpoint":
            return _checkpoint(state, why)
        case "abort":
            return fail(state, why, EXIT_RESTART if ev.restart else EXIT_ABORTED)
    return _refuse(state, why, f"unknown operator command {ev.kind!r}")


def _refuse(state: State, why: str, text: str) -> Decision:
    return Decision(state, (), f"{why} refused: {text}", rejected=text)


def _hold(state: State, now: float, why: str) -> Decision:
    if state.phase == Phase.STARTING:
        return _refuse(state, why, "the job has not started yet")
    if state.phase == Phase.RUNNING:
        return start_hold(replace(state, operator_hold=True), now, why, failure=False, flush=True)
    held = replace(state, operator_hold=True, deadline=None if state.phase == Phase.WAITING else state.deadline)
    # The trainer, held for a failure, bounds its wait for a decision (trainer_hooks/session.py); an
    # operator hold has no such bound. Tell it an operator holds it now: the same generation, no flush.
    tell = (
        (HoldTrainer(state.generation, False, state.hold_down, why),)
        if state.phase in (Phase.HOLDING, Phase.WAITING)
        else ()
    )
    return Decision(held, tell, f"{why}; already holding, will stay held until an operator resumes")


def _resume(state: State, now: float, why: str) -> Decision:
    if not state.operator_hold:
        return _refuse(state, why, f"the job is {state.phase} and not held by an operator")
    deadline = now + state.policy.elastic_timeout_seconds if state.phase == Phase.WAITING else state.deadline
    return evaluate(replace(state, operator_hold=False, deadline=deadline), now, why)


def _not_a_slice(state: State, s: int | None) -> str:
    if s is None or s not in state.policy.all_slices:
        return f"slice {s} is not in this job (slices 0..{state.policy.num_slices - 1})"
    return ""


def _drain(state: State, ev: OperatorCommand, now: float, why: str) -> Decision:
    s = ev.slice
    bad = _not_a_slice(state, s)
    if bad or s is None:
        return _refuse(state, why, bad)
    if s in state.drains:
        return Decision(state, (), f"{why}; slice {s} is already draining", outcome="duplicate")
    left = state.up_slices() - {s}
    p = state.policy
    if len(left) < p.min_slices:
        # Its hosts stay healthy, so no replacement would ever come: the
        # job would hold until elastic_timeout_seconds and then fail.
        return _refuse(
            state,
            why,
            f"draining slice {s} would leave {len(left)} slice(s) up, fewer than the {p.min_slices} that "
            f"elastic_min_slice_count={p.elastic_min_slice_count} requires; a drained host stays healthy, so "
            "no replacement would come. Lower elastic_min_slice_count, or drain once a spare slice is up",
        )
    drains = {**state.drains, s: Drain(now, "operator_drain", "operator", ev.reason)}
    return evaluate(replace(state, drains=_frozen(drains)), now, f"{why}; draining slice {s}")


def _undrain(state: State, ev: OperatorCommand, now: float, why: str) -> Decision:
    """Undo a drain: the slice counts again, and the job grows back onto it once its hosts are up.

    An operator's or the straggler detector's drain is the operator's to lift (docs/stragglers.md).

    A notice's drain is the notice's to lift unless the operator forces it: a notice can be wrong,
    and nothing else would lift it.
    """
    s = ev.slice
    bad = _not_a_slice(state, s)
    if bad or s is None:
        return _refuse(state, why, bad)
    d = state.drains.get(s)
    plan = state.planned.get(s) if ev.force else None
    if d is None and plan is None:
        return _refuse(state, why, f"slice {s} is not drained")
    if d is not None and d.source not in ("operator", "straggler") and not ev.force:
        return _refuse(
            state,
            why,
            f"slice {s} was drained by a {d.kind} notice ({d.source}), not by an operator; that drain lifts "
            "when the notice is cancelled, its window is long over or the host is replaced; "
            "undrain --force lifts it now",
        )
    drains = {k: v for k, v in state.drains.items() if k != s}
    planned = {k: v for k, v in state.planned.items() if k != s}
    forced = [
        f"the {what} from a {x.kind} notice ({x.source})"
        for x, what in ((d, "drain"), (plan, "planned drain"))
        if x is not None and x.source not in ("operator", "straggler")
    ]
    note = f"; forced: {' and '.join(forced)} lifted" if forced else ""
    new_state = replace(state, drains=_frozen(drains), planned=_frozen(planned))
    return evaluate(new_state, now, f"{why}; slice {s} no longer drained{note}")


def _checkpoint(state: State, why: str) -> Decision:
    if not state.trainer.attached:
        return _refuse(state, why, "no trainer is attached")
    if state.phase == Phase.STARTING:
        return _refuse(state, why, "the job has not started yet")
    if state.policy.multi_controller:
        # A save is collective: its processes would each save at a different boundary.
        # Not a shrink rule (transitions.cannot_shrink): nothing is lost here.
        return _refuse(
            state, why, "a multi-controller job flushes only at an agreed step: hold (it flushes), then resume"
        )
    return Decision(state, (FlushTrainer(state.generation, why),), f"{why}; asking the trainer to flush")
