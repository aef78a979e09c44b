"""What a worker sidecar's report changes: a host joins, is lost, goes away or changes health.

Every observation names the registration it is about; one about an older registration is stale.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.core.evaluate import evaluate
from agent.core.membership import recent_losses, rejoin_deadline_after
from agent.core.model import (
    Decision,
    HostRecord,
    Phase,
    State,
    WorkerAway,
    WorkerHealth,
    WorkerJoined,
    WorkerLost,
    _frozen,
)
from agent.core.transitions import replace


def worker_joined(state: State, ev: WorkerJoined, now: float) -> Decision:
    p = state.policy
    if not (0 <= ev.slice < p.num_slices and 0 <= ev.host < p.hosts_per_slice):
        return Decision(
            state,
            (),
            f"refused host {ev.slice}.{ev.host}: the job has slices 0..{p.num_slices - 1} "
            f"and hosts 0..{p.hosts_per_slice - 1}",
        )
    key = (ev.slice, ev.host)
    old = state.hosts.get(key)
    record, what, errors = _registration(state, ev, old, now)
    if old is not None and old.incarnation != ev.incarnation and old.rival == ev.incarnation:
        # The incarnation this one took over from, back again: two sidecars claim the host.
        what += (
            f"; flapping: incarnation {ev.incarnation} was replaced by {old.incarnation} and is back "
            "(two sidecars claim this host)"
        )
    lost = state.lost_incarnations
    if key in lost and lost[key] != ev.incarnation:
        lost = _frozen({k: v for k, v in lost.items() if k != key})
    new = replace(
        state,
        (ev.slice,),
        hosts=state.hosts.with_record(key, record),  # copies one slice's hosts, not all of them
        slice_errors=errors,
        lost_incarnations=lost,
        expected_rejoin=state.expected_rejoin.without([key]),
        rejoin_deadline=rejoin_deadline_after(state, key, now),
    )
    if state.phase == Phase.STARTING and ev.generation_seen > state.generation:
        # A coordinator that starts blind learns from the workers where the job was.
        new = replace(new, generation=ev.generation_seen)
    return evaluate(new, now, f"host {ev.slice}.{ev.host} ({ev.node or '?'}) {what}")


def _registration(
    state: State, ev: WorkerJoined, old: HostRecord | None, now: float
) -> tuple[HostRecord, str, Mapping[int, float]]:
    """The host's record after this registration, what it was, and the slices' error marks."""
    key = (ev.slice, ev.host)
    settled = state.policy.settle_seconds <= 0
    fresh = HostRecord(ev.incarnation, ev.node, ev.node_pool, now, True, now, settled, None, ev.registration)
    errors = state.slice_errors
    if old is not None and old.incarnation == ev.incarnation:
        # The same process again (a stream blip, a coordinator restart): neither a repair nor a loss.
        record = replace(old, node=ev.node, node_pool=ev.node_pool, away_since=None, registration=ev.registration)
        return record, "re-registered", errors
    if old is not None and old.away_since is not None:
        # Its sidecar restarted while the host's Pathways worker kept answering: no loss, no repair.
        what = f"sidecar restarted (was incarnation {old.incarnation}; the host stayed up)"
        return _taken_over(old, ev, node=ev.node), what, errors
    if old is not None and key in state.expected_rejoin and ev.node and ev.node == old.node:
        # A new sidecar on the same node while this coordinator was down: it registers only once its
        # host's Pathways worker serves, so the host stayed; a different node would be a loss.
        what = f"sidecar restarted while the coordinator was down (was incarnation {old.incarnation}; same node)"
        return _taken_over(old, ev, healthy=True), what, errors
    if state.lost_incarnations.get(key) == ev.incarnation:
        return (*_back_from_loss(state, ev, fresh, now), errors)
    if old is not None and key in state.expected_rejoin:
        # A restarted coordinator's record, and a new sidecar on another node: nobody could check the
        # old host, and this is what a replacement looks like. The old one counts as lost until it settles.
        what = f"replaced live incarnation {old.incarnation} on another node (the old one counts as lost)"
        return fresh, what, _frozen({**errors, ev.slice: now - 1e-6})
    if old is not None and (ev.slice in errors or ev.slice in state.trainer_errors or ev.slice in state.drains):
        # The slice is out already: a new sidecar is what a replacement looks like, and costs nothing.
        what = f"replaced incarnation {old.incarnation} while its slice was out (repairs it once settled)"
        return replace(fresh, rival=old.incarnation), what, errors
    if old is not None:
        return _second_sidecar(state, old, ev, now), _second_sidecar_what(old, ev), errors
    return fresh, "registered", errors


def _taken_over(old: HostRecord, ev: WorkerJoined, **changes: Any) -> HostRecord:
    """The host's record, now spoken for by the new incarnation (it keeps its registration time)."""
    return replace(
        old,
        incarnation=ev.incarnation,
        node_pool=ev.node_pool,
        away_since=None,
        registration=ev.registration,
        rival=old.incarnation,
        **changes,
    )


def _back_from_loss(state: State, ev: WorkerJoined, fresh: HostRecord, now: float) -> tuple[HostRecord, str]:
    """The very process declared lost serves again (a hung host that woke up).

    It repairs its slice once settled, like a replacement, unless it is flapping: then its
    registration time predates the mark, so only a new incarnation repairs.
    """
    losses = recent_losses(state, (ev.slice, ev.host), now)
    if len(losses) < state.policy.flap_losses:
        return fresh, "came back after it was declared lost (repairs its slice once healthy for the settle time)"
    mark = min(state.slice_errors.get(ev.slice, now), state.trainer_errors.get(ev.slice, now))
    what = (
        f"came back after it was declared lost {len(losses)} times in "
        f"{state.policy.flap_window_seconds:g} s (flapping: not a repair; only a new incarnation is)"
    )
    return replace(fresh, registered_at=mark - 1.0), what


def _second_sidecar(state: State, old: HostRecord, ev: WorkerJoined, now: float) -> HostRecord:
    """A second sidecar claims a host whose sidecar is live: the newer registration speaks for it.

    Nobody saw the host fail, and a lost host is a failed check of the host itself, never a
    second process registering: no loss, no repair.
    """
    healthy = old.healthy
    return _taken_over(
        old,
        ev,
        node=ev.node,
        healthy=True,
        healthy_since=old.healthy_since if healthy else now,
        settled=old.settled if healthy else state.policy.settle_seconds <= 0,
    )


def _second_sidecar_what(old: HostRecord, ev: WorkerJoined) -> str:
    return (
        f"claimed by a second sidecar, incarnation {ev.incarnation} on {ev.node or '?'}, while incarnation "
        f"{old.incarnation} on {old.node or '?'} was live: the newer one speaks for the host (no loss)"
    )


def _about(old: HostRecord | None, ev: WorkerLost | WorkerAway | WorkerHealth) -> bool:
    """The observation is about this very registration (not an older stream of the host)."""
    return old is not None and old.incarnation == ev.incarnation and old.registration == ev.registration


def worker_lost(state: State, ev: WorkerLost, now: float) -> Decision:
    key = (ev.slice, ev.host)
    if not _about(state.hosts.get(key), ev):
        return Decision(
            state,
            (),
            f"stale loss of host {ev.slice}.{ev.host} incarnation {ev.incarnation} "
            f"(registration {ev.registration}) ignored",
        )
    # Marked lost: only a host registered after the mark that settles brings the slice back.
    new = replace(
        state,
        (ev.slice,),
        hosts=state.hosts.without([key]),
        slice_errors=_frozen({**state.slice_errors, ev.slice: now}),
        lost_incarnations=_frozen({**state.lost_incarnations, key: ev.incarnation}),
        host_losses=_frozen({**state.host_losses, key: (*recent_losses(state, key, now), now)}),
    )
    return evaluate(new, now, f"host {ev.slice}.{ev.host} lost ({ev.cause})")


def worker_away(state: State, ev: WorkerAway, now: float) -> Decision:
    key = (ev.slice, ev.host)
    old = state.hosts.get(key)
    if old is None or not _about(old, ev):
        return Decision(
            state,
            (),
            f"stale report about host {ev.slice}.{ev.host} incarnation {ev.incarnation} "
            f"(registration {ev.registration}) ignored",
        )
    hosts = state.hosts.with_record(key, replace(old, away_since=now if old.away_since is None else old.away_since))
    detail = f" ({ev.detail})" if ev.detail else ""
    why = (
        f"sidecar of host {ev.slice}.{ev.host} disconnected but its Pathways worker still answers{detail}: "
        "the host stays in the job while its sidecar comes back"
    )
    return Decision(replace(state, (ev.slice,), hosts=hosts), (), why)


def worker_health(state: State, ev: WorkerHealth, now: float) -> Decision:
    key = (ev.slice, ev.host)
    old = state.hosts.get(key)
    if old is None or not _about(old, ev):
        return Decision(state, (), f"health report from unknown host {ev.slice}.{ev.host} ignored")
    if old.healthy == ev.healthy:
        return Decision(state, (), f"host {ev.slice}.{ev.host} health unchanged")
    if ev.healthy:
        record = replace(old, healthy=True, healthy_since=now, settled=state.policy.settle_seconds <= 0)
    else:
        record = replace(old, healthy=False, settled=False)
    hosts = state.hosts.with_record(key, record)
    word = "healthy" if ev.healthy else "unhealthy"
    detail = f": {ev.detail}" if ev.detail else ""
    return evaluate(replace(state, (ev.slice,), hosts=hosts), now, f"host {ev.slice}.{ev.host} {word}{detail}")
