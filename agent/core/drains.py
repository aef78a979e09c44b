"""Drains: which flush, a planned drain begins, a stale notice's drain lifts, a held job waits for a window.

Pure functions of the state that :mod:`agent.core.evaluate` applies; docs/design.md and docs/notices.md
have the rules.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.core.model import Decision, Phase, State, TrainerView, _frozen
from agent.core.transitions import fmt, replace, start_hold

NOTICE_STALE_SECONDS = 600.0
"""Seconds past an announced disruption's end after which a node still up and healthy came through it.

A notice that old is logged, not acted on, and a notice's drain of such a node is lifted. Pub/Sub
redelivers for days, so a bound is what keeps a replayed notice out (docs/design.md)."""
MC_NOTICE_EXIT_MARGIN = 5.0
"""Multi-controller: seconds before an announced node goes at which a held job stops waiting for a
cancellation and restarts (every process exits 42 itself, not with its host)."""
SAVES_KEPT = 3
"""Timed flushes the expected flush time is measured over (:func:`expected_flush`)."""
FROM_MEMORY = "the slices that remain hold a replica of the state: a snapshot in memory, nothing to storage"


def flush_why(state: State, remaining: frozenset[int]) -> str:
    """Why a drain that leaves ``remaining`` slices training must flush to storage ("" when it need not).

    On Pathways the slices that remain hold the whole state (one replica per slice) and its
    snapshot in their hosts' memory, so training goes on from memory. Storage is needed when no
    replica would be kept, or the processes restart. A layout without a replica per slice is the
    trainer's to know: asked for a snapshot it cannot keep there, it flushes (trainer_hooks/session.py).
    """
    p = state.policy
    if p.multi_controller:
        return "a multi-controller job restarts its processes, which keep nothing in memory"
    if not remaining:
        return "no slice would remain to hold a replica of the state"
    if len(remaining) < p.min_slices:
        return (
            f"{len(remaining)} slice(s) would remain, fewer than the minimum {p.min_slices}: the job waits for the "
            "slice, and a wait past elastic_timeout_seconds restarts from storage"
        )
    return ""


def next_mesh(state: State) -> frozenset[int] | None:
    """The slices a drain will leave the job on next, when one will shrink it (None otherwise).

    A notice names the slices that go, so this mesh is known for its whole lead: the trainer may build its
    program meanwhile (:class:`agent.core.model.PrepareTrainer`). Of several planned drains only the earliest
    is next. None for a job that does not run, that cannot shrink, or that the drain would leave below
    ``min_slices`` (it waits for the slice then, on no smaller mesh).
    """
    p = state.policy
    if state.phase.terminal or state.phase == Phase.STARTING or p.multi_controller or not state.active:
        return None
    going: set[int] = set()
    if state.planned:
        first = min(d.since for d in state.planned.values())
        going = {s for s, d in state.planned.items() if d.since == first}
    remaining = (state.active & state.up_slices()) - going
    if not remaining or remaining == state.active or len(remaining) < p.min_slices:
        return None
    return remaining


def expected_flush(t: TrainerView) -> tuple[float, int, float] | None:
    """(seconds, state bytes, bytes a second) a flush is expected to take: the newest flush's bytes over
    the rate of the trainer's newest timed flushes; None when it has reported none."""
    if not t.saves:
        return None
    rate = sum(b for b, _ in t.saves) / sum(s for _, s in t.saves)
    nbytes = t.saves[-1][0]
    return nbytes / rate, nbytes, rate


def with_save(t: TrainerView, nbytes: int, seconds: float) -> TrainerView:
    """``t`` after a flush the trainer timed (an untimed one, a periodic commit, says nothing of the rate)."""
    if nbytes <= 0 or seconds <= 0:
        return t
    return replace(t, saves=(*t.saves, (int(nbytes), float(seconds)))[-SAVES_KEPT:])


def _lead(state: State, slices: Iterable[int], now: float) -> float | None:
    """Seconds until the first of ``slices``' announced disruptions (None: no notice said when)."""
    times = [
        t
        for s in slices
        if (d := state.drains.get(s)) is not None
        for t in (d.deadline if d.deadline is not None else d.starts_at,)
        if t is not None
    ]
    return min(times) - now if times else None


def lead_note(state: State, lead: float | None) -> str:
    """The notice's lead against the flush expected, for a reason; starts with "; "."""
    exp = expected_flush(state.trainer)
    if exp is None:
        expect = "expected flush time unknown (the trainer has reported no timed flush)"
    else:
        secs, nbytes, rate = exp
        expect = f"expected flush {secs:.1f} s ({nbytes / 1e9:.3g} GB at {rate / 1e9:.3g} GB/s measured)"
    if lead is None:
        return f"; {expect}"
    if exp is not None and lead < exp[0]:
        return (
            f"; the notice's lead ({lead:.0f} s) is shorter than the {expect}: flushing at once, "
            "it may not finish before the host goes"
        )
    return f"; {expect}, lead {lead:.0f} s"


def prepare_wait(state: State, lead: float | None) -> float | None:
    """Seconds a drain from memory may train on, before it holds, while the next mesh's program is built.

    Half the notice's ``lead``, so that the snapshot at the held step has the other half before the host
    goes (a Spot VM's 30 s gives 15 s). None when no notice said when (an operator's drain): the trainer's
    own default. At most ``elastic_timeout_seconds``: of the hold's acknowledgement bound
    (:func:`agent.core.transitions.start_hold`) ``flush_timeout_seconds`` is left for the snapshot, or for
    the flush of a trainer that cannot keep one.
    """
    if lead is None:
        return None
    return max(0.0, min(lead / 2, state.policy.elastic_timeout_seconds))


def drain_hold(state: State, now: float, why: str, leaving: frozenset[int]) -> Decision:
    """Hold for slices drained away: from memory (a snapshot at the held step) where a replica stays on
    the slices that remain, else a flush, the reason saying why and how the notice's lead compares."""
    flush = flush_why(state, state.up_slices())
    lead = _lead(state, leaving, now)
    if not flush:
        wait = prepare_wait(state, lead)
        return start_hold(state, now, f"{why}; {FROM_MEMORY}", failure=False, snapshot=True, prepare_wait=wait)
    note = lead_note(state, lead)
    return start_hold(state, now, f"{why}; flush: {flush}{note}", failure=False, flush=True)


def plan_begin(state: State, slices: frozenset[int], starts_at: float) -> tuple[float, str]:
    """When a drain of ``slices`` announced for ``starts_at`` begins, and a note for the reason.

    ``notice_lead_seconds`` before the start; a drain that will flush begins earlier when the flush
    expected takes longer than that, so it can finish before the window (at once if that is past).
    """
    lead = state.policy.notice_lead_seconds
    exp = expected_flush(state.trainer)
    if exp is None or exp[0] <= lead or not flush_why(state, state.up_slices() - slices):
        return starts_at - lead, ""
    return starts_at - exp[0], f" (the expected flush, {exp[0]:.0f} s, is longer than the {lead:g} s lead)"


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
