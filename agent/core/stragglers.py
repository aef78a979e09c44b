"""A straggler verdict in the decision core: ``drain`` drains the slice as an operator drain does.

The detector and the cost rule live in :mod:`agent.stragglers`; here only the limits every drain
obeys (``min_slices``) and the straggler drain's own rate limit, each refused with its reason; and,
under ``--straggler-replace``, when the drained slice's replacement is asked for (:func:`replacements`).
"""

from __future__ import annotations

from agent.core.evaluate import evaluate
from agent.core.model import Decision, Drain, Phase, ReplaceSlice, State, StragglerVerdict, _frozen
from agent.core.transitions import replace

ACTIONS = ("drain", "alert", "keep")


def straggler_verdict(state: State, ev: StragglerVerdict, now: float) -> Decision:
    who = "the job" if ev.scope == "job" else f"slice {ev.slice}"
    why = f"straggler verdict on {who}: {ev.action}: {ev.reason}"
    if ev.action not in ACTIONS or ev.scope not in ("slice", "job"):
        return _refuse(state, why, f"unknown action {ev.action!r} or scope {ev.scope!r}")
    if ev.action != "drain":
        return Decision(state, (), f"{why}; no action")
    if ev.scope != "slice" or ev.slice not in state.policy.all_slices:
        return _refuse(state, why, f"a drain needs a slice of this job (0..{state.policy.num_slices - 1})")
    s = ev.slice
    if s in state.drains:
        return Decision(state, (), f"{why}; slice {s} is already draining", outcome="duplicate")
    if state.phase != Phase.RUNNING:
        return _refuse(state, why, f"the job is {state.phase}, not running: a straggler is weighed while it trains")
    p = state.policy
    left = state.up_slices() - {s}
    if len(left) < p.min_slices:
        return _refuse(
            state,
            why,
            f"draining slice {s} would leave {len(left)} slice(s) up, fewer than the {p.min_slices} that "
            f"elastic_min_slice_count={p.elastic_min_slice_count} requires",
        )
    last = _last_straggler_drain(state)
    if last is not None and now - last < p.straggler_drain_interval_seconds and not ev.operator_asked:
        return _refuse(
            state,
            why,
            f"a straggler was drained {now - last:.0f} s ago; at most one straggler drain in "
            f"{p.straggler_drain_interval_seconds:g} s goes without an operator",
        )
    drains = {**state.drains, s: Drain(now, "straggler", "straggler", ev.reason, replace=p.straggler_replace)}
    drained = replace(state, drains=_frozen(drains), straggler_drained_at=now)
    return evaluate(drained, now, f"{why}; draining slice {s}")


def replacements(state: State, active: frozenset[int]) -> tuple[State, tuple[ReplaceSlice, ...]]:
    """The straggler drains to replace now that the trainer runs on ``active`` (its resume acknowledged).

    Not with the drain itself: deleting the slice's pods before the trainer held at the step boundary
    would fail the step it is finishing, turning a drain into a failure. A slice with a host registered
    since its drain is being replaced already (a new pod): its pods are left alone.
    """
    due = [
        s
        for s, d in sorted(state.drains.items())
        if d.replace
        and s not in active
        and not any(r.registered_at > d.since for r in state.hosts.slice_records(s).values())
    ]
    if not due:
        return state, ()
    drains = {**state.drains, **{s: replace(state.drains[s], replace=False) for s in due}}
    actions = tuple(
        ReplaceSlice(s, f"--straggler-replace: the job runs without straggler slice {s}; replacing its pods")
        for s in due
    )
    return replace(state, drains=_frozen(drains)), actions


def _last_straggler_drain(state: State) -> float | None:
    """The newest straggler drain: this process's, or one that still stands (it survives a restart)."""
    times = [d.since for d in state.drains.values() if d.source == "straggler"]
    if state.straggler_drained_at is not None:
        times.append(state.straggler_drained_at)
    return max(times, default=None)


def _refuse(state: State, why: str, text: str) -> Decision:
    return Decision(state, (), f"{why}; refused: {text}", rejected=text)
