"""Drains over time: a planned drain begins, a stale notice's drain lifts, a held job waits for a window.

Pure functions of the state that :mod:`agent.core.evaluate` applies; docs/design.md has the rules.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.core.model import State, _frozen
from agent.core.transitions import fmt, replace

NOTICE_STALE_SECONDS = 600.0
"""Seconds past an announced disruption's end after which a node still up and healthy came through it.

A notice that old is logged, not acted on, and a notice's drain of such a node is lifted. Pub/Sub
redelivers for days, so a bound is what keeps a replayed notice out (docs/design.md)."""
MC_NOTICE_EXIT_MARGIN = 5.0
"""Multi-controller: seconds before an announced node goes at which a held job stops waiting for a
cancellation and restarts (every process exits 42 itself, not with its host)."""


def notice_end(ends_at: float | None, deadline: float | None, starts_at: float | None) -> float | None:
    """When an announced disruption is over: its window's end, else when the node was to go.

    GCE's ``windowEndTime`` is "the time by which the maintenance disruption will be completed"
    (Compute Engine API ``UpcomingMaintenance``); never before the window starts.
    """
    if ends_at is not None:
        return ends_at
    known = [t for t in (deadline, starts_at) if t is not None]
    return max(known) if known else None


def hosts_healthy(state: State, slices: Iterable[int]) -> bool:
    """Every host of each of ``slices`` registered and healthy (at least one slice)."""
    seen = False
    for s in slices:
        of = state.hosts.slice_records(s)
        if any((r := of.get(h)) is None or not r.healthy for h in range(state.policy.hosts_per_slice)):
            return False
        seen = True
    return seen


def begin_planned(state: State, now: float) -> tuple[State, str]:
    """Move planned drains whose time has come into ``drains``; say which."""
    due = {s: d for s, d in state.planned.items() if d.since <= now}
    if not due:
        return state, ""
    drains, planned = dict(state.drains), dict(state.planned)
    for s, d in due.items():
        del planned[s]
        if s not in drains:
            drains[s] = replace(d, since=now)
    starts = min((d.starts_at for d in due.values() if d.starts_at is not None), default=None)
    when = f", {starts - now:.0f} s before the window starts" if starts is not None else ""
    return replace(state, drains=_frozen(drains), planned=_frozen(planned)), (
        f"planned drain of slice(s) {fmt(set(due))} begins{when}"
    )


def lift_overdue(state: State, now: float) -> tuple[State, str]:
    """Lift notice drains whose disruption was to be over ``NOTICE_STALE_SECONDS`` ago while the hosts stayed up.

    Such a disruption did not happen to this node (or is long over): no cancellation and no
    replacement will come, so keeping the slice out would cost it for good.
    """
    overdue = {
        s: end
        for s, d in state.drains.items()
        if d.source != "operator"
        and (end := notice_end(d.ends_at, d.deadline, d.starts_at)) is not None
        and now - end > NOTICE_STALE_SECONDS
        and hosts_healthy(state, (s,))
    }
    if not overdue:
        return state, ""
    drains = {s: d for s, d in state.drains.items() if s not in overdue}
    ago = max(now - end for end in overdue.values())
    return replace(state, drains=_frozen(drains)), (
        f"notice drain of slice(s) {fmt(set(overdue))} lifted: the disruption was to be over up to {ago:.0f} s "
        f"ago (more than {NOTICE_STALE_SECONDS:g} s) and every host of it is still up and healthy"
    )


def announced_until(state: State, missing: frozenset[int], now: float) -> float | None:
    """Multi-controller, held: until when to keep the hold open for a notice that may still be cancelled.

    Only while every missing slice is drained for a window announced for later, every host of it
    is still up and healthy, and the held step is committed; never past the elastic timeout.
    None: restart now.
    """
    ends: list[float] = []
    for s in missing:
        d = state.drains.get(s)
        if d is None or d.source == "operator" or d.starts_at is None:
            # Only a window announced for later may still be cancelled; an imminent notice's host may go at once.
            return None
        if not hosts_healthy(state, (s,)):
            return None
        ends.append(d.starts_at)
    if not ends or state.trainer.step_in_memory < 0 or state.trainer.committed_step < state.trainer.step_in_memory:
        return None
    # Leave before the node goes, so that every process exits 42 itself rather than with its host.
    until = min(ends) - MC_NOTICE_EXIT_MARGIN
    if state.deadline is not None:
        until = min(until, state.deadline)
    return until if until > now else None
