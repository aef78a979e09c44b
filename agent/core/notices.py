"""What a node notice changes: a drain now, a drain planned for later, or a drain lifted.

A notice is never a failure: only a host actually lost is. docs/design.md has the rules.
"""

from __future__ import annotations

from agent.core.drains import NOTICE_STALE_SECONDS, hosts_healthy, next_mesh, notice_end, plan_begin
from agent.core.evaluate import evaluate
from agent.core.model import Decision, Drain, NodeNotice, PrepareTrainer, State, _frozen
from agent.core.transitions import fmt, replace


def node_notice(state: State, ev: NodeNotice, now: float) -> Decision:
    d = _node_notice(state, ev, now)
    if not d.actions and any(p.since <= now for p in d.state.planned.values()):
        # A notice that changes nothing still begins a planned drain that is due, as a tick would.
        d = replace(evaluate(d.state, now, d.reason), outcome=d.outcome)
    return _with_prepare(state, d)


def _with_prepare(before: State, d: Decision) -> Decision:
    """Tell the trainer first which slices the job will run on next when the notice changed them: it may
    build that mesh's program during the lead (and the hold), so the resume onto it need not compile."""
    nxt = next_mesh(d.state)
    if nxt is None or nxt == next_mesh(before):
        return d
    why = f"the job will next run on slice(s) {fmt(nxt)}: prepare that mesh's program"
    return replace(d, actions=(PrepareTrainer(d.state.generation, nxt, why), *d.actions))


def _node_notice(state: State, ev: NodeNotice, now: float) -> Decision:
    what = ev.node or ev.node_pool or (f"slice {ev.slice}" if ev.slice is not None else "?")
    label = f"{ev.kind} for {what} from {ev.source}"
    slices = _notice_slices(state, ev)
    if not slices:
        return Decision(state, (), f"{label} ignored: not a node of this job", outcome="foreign")
    key = ev.node or ev.node_pool or f"slice/{ev.slice}"
    times = dict(state.notice_times)
    if ev.event_time is not None:
        newest = times.get(key)
        if newest is not None and ev.event_time < newest:
            return Decision(state, (), f"{label} ignored: older than a notice already handled", outcome="out_of_order")
        times[key] = ev.event_time
    state = replace(state, notice_times=_frozen(times))
    end = notice_end(ev.ends_at, ev.deadline, ev.starts_at)
    if not ev.cleared and end is not None and now - end > NOTICE_STALE_SECONDS and hosts_healthy(state, slices):
        return Decision(
            state,
            (),
            f"{label} ignored: the disruption was to be over {now - end:.0f} s ago (more than "
            f"{NOTICE_STALE_SECONDS:g} s) and the hosts of slice(s) {fmt(slices)} are up and healthy",
            outcome="stale",
        )
    if ev.cleared:
        return _cleared(state, ev, slices, now, label)
    begin, early = (None, "") if ev.starts_at is None else plan_begin(state, slices, ev.starts_at)
    if begin is not None and begin > now:
        return _plan(state, ev, slices, now, label + early, begin)
    return _drain_now(state, ev, slices, now, label)


def _notice_slices(state: State, ev: NodeNotice) -> frozenset[int]:
    if ev.slice is not None:
        return frozenset({ev.slice}) & state.policy.all_slices
    if ev.node:
        return frozenset(s for (s, _), r in state.hosts.items() if r.node == ev.node)
    if ev.node_pool:
        return frozenset(s for (s, _), r in state.hosts.items() if r.node_pool == ev.node_pool)
    return frozenset()


def _cleared(state: State, ev: NodeNotice, slices: frozenset[int], now: float, label: str) -> Decision:
    """A completed or cancelled notice lifts its drains and plans; an operator's drain stays."""
    drains, planned = dict(state.drains), dict(state.planned)
    lifted = {s for s in slices if s in drains and drains[s].source != "operator"}
    unplanned = {s for s in slices if s in planned}
    if not lifted and not unplanned:
        return Decision(state, (), f"{label}: nothing was draining", outcome="duplicate")
    for s in lifted:
        del drains[s]
    for s in unplanned:
        del planned[s]
    parts = [f"drain of {fmt(lifted)} lifted"] if lifted else []
    parts += [f"planned drain of {fmt(unplanned)} cancelled"] if unplanned else []
    new_state = replace(state, drains=_frozen(drains), planned=_frozen(planned))
    return evaluate(new_state, now, f"{label}: {', '.join(parts)}")


def _plan(state: State, ev: NodeNotice, slices: frozenset[int], now: float, label: str, begin: float) -> Decision:
    """Announced for later: keep training until ``notice_lead_seconds`` before it starts."""
    assert ev.starts_at is not None
    starts_at = ev.starts_at
    drains, planned = dict(state.drains), dict(state.planned)
    changed = {s for s in slices if s not in planned or planned[s].since != begin}
    # A window moved later than a drain it already started: that drain waits too.
    moved_out = {
        s
        for s in slices
        if s in drains and drains[s].source != "operator" and (drains[s].starts_at or starts_at) < starts_at
    }
    if not changed and not moved_out:
        return Decision(state, (), f"{label}: drain of {fmt(slices)} already planned", outcome="duplicate")
    for s in slices:
        planned[s] = Drain(begin, ev.kind, ev.source, ev.reason or label, ev.deadline, ev.node, starts_at, ev.ends_at)
    for s in moved_out:
        del drains[s]
    note = f"; drain of {fmt(moved_out)} lifted until then" if moved_out else ""
    why = (
        f"{label}: starts in {starts_at - now:.0f} s; draining slice(s) {fmt(slices)} "
        f"in {begin - now:.0f} s ({starts_at - begin:g} s before){note}"
    )
    return evaluate(replace(state, drains=_frozen(drains), planned=_frozen(planned)), now, why)


def _drain_now(state: State, ev: NodeNotice, slices: frozenset[int], now: float, label: str) -> Decision:
    """Due now (imminent, in progress, or its window began while the node is up): drain at the step boundary,
    from memory or with a flush (:func:`agent.core.drains.drain_hold`)."""
    drains, planned = dict(state.drains), dict(state.planned)
    new = {s for s in slices if s not in drains}
    for s in slices:
        planned.pop(s, None)
    if not new:
        why = f"{label}: slice(s) {fmt(slices)} already draining"
        return Decision(replace(state, planned=_frozen(planned)), (), why, outcome="duplicate")
    for s in new:
        drains[s] = Drain(now, ev.kind, ev.source, ev.reason or label, ev.deadline, ev.node, ev.starts_at, ev.ends_at)
    if ev.starts_at is not None and ev.starts_at <= now:
        left = f" (its window began {now - ev.starts_at:.0f} s ago; the node is still up)"
    elif ev.deadline is not None:
        left = f" ({ev.deadline - now:.0f} s before the deadline)" if ev.deadline > now else " (deadline passed)"
    else:
        left = ""
    new_state = replace(state, drains=_frozen(drains), planned=_frozen(planned))
    return evaluate(new_state, now, f"{label}: draining slice(s) {fmt(new)}{left}")
