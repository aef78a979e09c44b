"""When a slice counts: hosts settle, replacements repair marks, a restarted coordinator's hosts get a grace.

Pure functions of the state that :mod:`agent.core.evaluate` applies before any phase rule.
"""

from __future__ import annotations

from agent.core.model import HostKey, Phase, State, _frozen
from agent.core.transitions import rejoining_slices, replace


def recent_losses(state: State, key: HostKey, now: float) -> tuple[float, ...]:
    """When ``key`` was declared lost within the flap window."""
    window = state.policy.flap_window_seconds
    return tuple(t for t in state.host_losses.get(key, ()) if now - t <= window)


def rejoin_deadline_after(state: State, key: HostKey, now: float) -> float | None:
    """The rejoin deadline once the awaited host ``key`` has re-registered at ``now``.

    The grace counts from the newest re-registration: while awaited hosts keep coming back, a host
    not reached yet is in the coordinator's backlog, not late. In a hold or a wait the grace never
    outlasts the phase's own deadline.
    """
    deadline = state.rejoin_deadline
    if deadline is None or now >= deadline or key not in state.expected_rejoin:
        return deadline
    slid = max(deadline, now + state.policy.rejoin_grace_seconds)
    if state.phase in (Phase.HOLDING, Phase.WAITING) and state.deadline is not None:
        slid = min(slid, max(deadline, state.deadline))
    return slid


def in_rejoin_grace(state: State, now: float) -> bool:
    """Hosts a restarted coordinator knew may still come back: nobody is judged yet."""
    return bool(state.expected_rejoin) and state.rejoin_deadline is not None and now < state.rejoin_deadline


def expire_rejoin(state: State, now: float) -> tuple[State, str]:
    """The grace is over: awaited hosts that did not come back are lost, like any other."""
    if not state.expected_rejoin:
        return state, ""
    gone = frozenset(k for k in state.expected_rejoin if k in state.hosts)
    errors = dict(state.slice_errors)
    for sl, _ in gone:
        errors[sl] = now
    state = replace(
        state,
        {sl for sl, _ in gone},
        hosts=state.hosts.without(gone),
        slice_errors=_frozen(errors),
        expected_rejoin=frozenset(),
        rejoin_deadline=None,
    )
    return state, f"{len(gone)} host(s) did not rejoin within the grace" if gone else ""


def trim_surviving(state: State, now: float) -> State:
    """A slice that went down, even briefly, no longer holds a replica.

    One whose hosts have yet to rejoin a restarted coordinator is not known to be down: the
    trainer itself skips replicas Pathways reports lost when it reads memory.
    """
    up = state.up_slices()
    # Only when a replica is not up: after a restart every host is awaited, and this runs on each re-registration.
    if not state.trainer.surviving - up:
        return state
    rejoining = rejoining_slices(state, now)
    if not state.trainer.surviving - up - rejoining:
        return state
    keep = state.trainer.surviving & (up | rejoining)
    return replace(state, trainer=replace(state.trainer, surviving=keep))


def settle(state: State, now: float) -> State:
    """Mark hosts healthy for ``settle_seconds`` as settled (they may repair a lost slice).

    Only hosts of marked slices: ``settled`` matters only to repairing a mark, and walking every
    host at every event made each of many registrations walk every host.
    """
    marked = state.slice_errors.keys() | state.trainer_errors.keys() | state.drains.keys()
    if not marked:
        return state
    wait = state.policy.settle_seconds
    due = []
    for sl in marked:
        for h, r in state.hosts.slice_records(sl).items():
            if not r.settled and r.healthy and now - r.healthy_since >= wait:
                due.append((sl, h))
    if not due:
        return state
    hosts = state.hosts.with_records({k: replace(state.hosts[k], settled=True) for k in due})
    return replace(state, {k[0] for k in due}, hosts=hosts)


def forget_repaired(state: State) -> State:
    """Drop error and drain marks of slices a replacement host has repaired since.

    A repaired slice is up again either way; forgetting the mark means a later notice for the
    replacement drains it anew, and a later loss counts as a failure rather than as the old drain.
    """

    def repaired(s: int, mark: float) -> bool:
        # The slice's own hosts only: after a mass loss every slice is marked.
        return any(r.registered_at > mark and r.settled for r in state.hosts.slice_records(s).values())

    def whole(s: int, mark: float) -> bool:
        # A slice the trainer named: it did not say which host failed, so every host must be new since.
        of = state.hosts.slice_records(s)
        hosts = [of.get(h) for h in range(state.policy.hosts_per_slice)]
        return all(r is not None and r.registered_at > mark and r.settled for r in hosts)

    drains = {s: d for s, d in state.drains.items() if not repaired(s, d.since)}
    errors = {s: t for s, t in state.slice_errors.items() if not repaired(s, t)}
    named = {s: t for s, t in state.trainer_errors.items() if not whole(s, t)}
    if (len(drains), len(errors), len(named)) == (
        len(state.drains),
        len(state.slice_errors),
        len(state.trainer_errors),
    ):
        return state
    return replace(state, drains=_frozen(drains), slice_errors=_frozen(errors), trainer_errors=_frozen(named))
