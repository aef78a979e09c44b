"""The phase rules: given membership as it stands, what must happen now.

:func:`evaluate` brings the state up to ``now`` (settled hosts, repaired slices, drains that begin
or lift, the rejoin grace), then asks the rule of the current phase. Each rule returns its
:class:`Decision` at the first condition that holds, with the reason.
"""

from __future__ import annotations

from agent.core.drains import announced_until, begin_planned, drain_hold, lift_overdue
from agent.core.membership import expire_rejoin, forget_repaired, in_rejoin_grace, settle, trim_surviving
from agent.core.model import Decision, Phase, ResumeTrainer, State
from agent.core.transitions import (
    cannot_shrink,
    draining,
    fail,
    fmt,
    replace,
    restart,
    resume,
    source,
    start_hold,
)


def evaluate(state: State, now: float, why: str) -> Decision:
    """Given membership as it stands, what must happen now; ``why`` is what changed."""
    state = settle(forget_repaired(state), now)
    state, began = begin_planned(state, now)
    why = _join(why, began)
    state, lifted = lift_overdue(state, now)
    why = _join(why, lifted)
    state = trim_surviving(state, now)
    prefix = f"{why}; " if why else ""
    if in_rejoin_grace(state, now) and state.phase in (Phase.RUNNING, Phase.HOLDING, Phase.WAITING):
        return _await_rejoin(state, now, prefix)
    state, expired = expire_rejoin(state, now)
    if expired:
        prefix += f"{expired}; "
    up = state.up_slices()
    if state.phase == Phase.STARTING:
        return _starting(state, now, up, prefix)
    if state.phase == Phase.RUNNING:
        return _running(state, now, up, prefix, why)
    if state.phase == Phase.HOLDING:
        return _holding(state, now, up, prefix)
    if state.phase == Phase.WAITING:
        return _waiting(state, now, up, prefix)
    return Decision(state, (), why)


def _join(why: str, more: str) -> str:
    if not more:
        return why
    return f"{why}; {more}" if why else more


def _await_rejoin(state: State, now: float, prefix: str) -> Decision:
    """After a coordinator restart nobody is judged on membership until its hosts rejoined or the grace passed."""
    if state.phase == Phase.HOLDING and state.deadline is not None and now >= state.deadline:
        return fail(state, f"{prefix}trainer did not acknowledge the hold in time")
    return Decision(state, (), f"{prefix}waiting for {len(state.expected_rejoin)} host(s) to rejoin")


def _starting(state: State, now: float, up: frozenset[int], prefix: str) -> Decision:
    p = state.policy
    if state.trainer.attached and up == p.all_slices:
        return resume(state, up, f"{prefix}all {p.num_slices} slices up; starting")
    if state.deadline is None or now < state.deadline:
        return Decision(state, (), f"{prefix}starting: {len(up)} of {p.num_slices} slices up")
    if state.trainer.attached and len(up) >= p.min_slices:
        return resume(state, up, f"{prefix}start deadline passed; starting on {fmt(up)}")
    return fail(
        state,
        f"{prefix}only {len(up)} of {p.num_slices} slices up (trainer attached: {state.trainer.attached}) "
        f"after {max(p.start_timeout_seconds, p.elastic_timeout_seconds):g} s at start",
    )


def _running(state: State, now: float, up: frozenset[int], prefix: str, why: str) -> Decision:
    lost = state.active - up
    if lost:
        failed = lost - draining(state)
        if failed and cannot_shrink(state):
            return restart(state, f"{prefix}active slice(s) {fmt(failed)} down")
        if not failed:
            # Announced: drain at the step boundary, lose nothing; from memory where a replica stays.
            return drain_hold(state, now, f"{prefix}leaving slice(s) {fmt(lost)} at the step boundary", lost)
        return start_hold(state, now, f"{prefix}active slice(s) {fmt(lost)} down", failure=True)
    t = state.trainer
    if t.attached and t.resume_pending and t.held:
        return _repeat_resume(state, prefix)
    if up - state.active and t.attached:
        return start_hold(state, now, f"{prefix}slice(s) {fmt(up - state.active)} back; growing", failure=False)
    gone = link_gone_too_long(state, now)
    if gone:
        return fail(state, f"{prefix}{gone}")
    hang = suspected_hang(state, now)
    if hang and cannot_shrink(state):
        return restart(state, f"{prefix}{hang}")
    if hang:
        return start_hold(state, now, f"{prefix}{hang}", failure=True, flush=True)
    return Decision(state, (), why or "running")


def _repeat_resume(state: State, prefix: str) -> Decision:
    """The trainer says it is held and has not acknowledged our resume: send it again.

    The resume was sent while it was away, lost with the old link, or decided just before this
    coordinator restarted. Once per report of being held.
    """
    t, g, active = state.trainer, state.generation, state.active
    again = replace(state, trainer=replace(t, held=False))
    reason = f"{prefix}repeating the unacknowledged resume generation {g} on {fmt(active)}"
    return Decision(again, (ResumeTrainer(g, active, source(t, active), reason),), reason)


def _holding(state: State, now: float, up: frozenset[int], prefix: str) -> Decision:
    p = state.policy
    if state.deadline is not None and now >= state.deadline:
        flushes = state.hold_flush or state.hold_snapshot
        limit = p.elastic_timeout_seconds + (p.flush_timeout_seconds if flushes else 0.0)
        return fail(state, f"{prefix}trainer did not acknowledge the hold within {limit:g} s")
    # A hold for a trainer whose link is gone (suspected hung) ends no later than that link's own limit.
    gone = link_gone_too_long(state, now)
    if gone:
        return fail(state, f"{prefix}{gone}")
    newly_down = (p.all_slices - up) - state.hold_down
    failed = newly_down - draining(state)
    if failed and cannot_shrink(state):
        # A process may now be blocked in a collective instead of reaching the boundary.
        return restart(state, f"{prefix}slice(s) {fmt(failed)} down while holding")
    if newly_down:
        # Tell the trainer not to read its state from these slices either.
        # A slice drained while a hold is pending follows the drain rules, as one drained while running.
        also = f"{prefix}slice(s) {fmt(newly_down)} also down"
        if newly_down & draining(state) and not failed:
            return drain_hold(state, now, also, newly_down)
        return start_hold(state, now, also, failure=False, flush=True if newly_down & draining(state) else None)
    return Decision(state, (), f"{prefix}waiting for the trainer to hold")


def _waiting(state: State, now: float, up: frozenset[int], prefix: str) -> Decision:
    p = state.policy
    if cannot_shrink(state) and up != p.all_slices and not state.operator_hold:
        return _wait_for_window_or_restart(state, now, up, prefix)
    newly_down = (p.all_slices - up) - state.hold_down
    if newly_down and not state.hold_flush and len(up) < p.min_slices and state.trainer.step_in_memory >= 0:
        # A second loss during a hold that did not flush: memory no longer
        # suffices to go on soon, so make the held step durable now.
        why = f"{prefix}slice(s) {fmt(newly_down)} also down while held"
        return start_hold(state, now, why, failure=False, flush=True)
    if state.operator_hold:
        return Decision(state, (), f"{prefix}held by an operator until an operator resumes")
    if state.unnamed_error_until is not None:
        if now < state.unnamed_error_until and up >= state.active and len(up) >= p.min_slices:
            left = state.unnamed_error_until - now
            return Decision(
                state,
                (),
                f"{prefix}a slice error named no slice and every slice still looks up: waiting {left:.1f} s "
                "for the failed host to show before resuming",
            )
        state = replace(state, unnamed_error_until=None)
    if len(up) >= p.min_slices and up:
        return resume(state, up, f"{prefix}{len(up)} of {p.num_slices} slices up (minimum {p.min_slices})")
    if state.deadline is not None and now >= state.deadline:
        return fail(
            state,
            f"{prefix}only {len(up)} of {p.num_slices} slices up after {p.elastic_timeout_seconds:g} s "
            f"(minimum {p.min_slices})",
        )
    return Decision(state, (), f"{prefix}holding until {p.min_slices} slices are up ({len(up)} now)")


def _wait_for_window_or_restart(state: State, now: float, up: frozenset[int], prefix: str) -> Decision:
    """A job that cannot shrink, held and flushed with slices out: wait for a cancellable window, else restart."""
    missing = state.policy.all_slices - up
    until = announced_until(state, missing, now)
    if until is not None:
        return Decision(
            state,
            (),
            f"{prefix}held and flushed at step {state.trainer.step_in_memory}; slice(s) "
            f"{fmt(missing)} announced to leave, hosts still up: waiting {until - now:.0f} s "
            "for the disruption (a cancelled notice resumes every process; a lost host restarts the job)",
        )
    t = state.trainer
    kept = (
        f"the held step {t.step_in_memory} is committed"
        if t.committed_step >= t.step_in_memory
        else f"the held step {t.step_in_memory} is NOT committed (newest committed {t.committed_step})"
    )
    return restart(state, f"{prefix}slice(s) {fmt(missing)} out of the job, {kept}")


def link_gone_too_long(state: State, now: float) -> str:
    """Why the trainer's link has been gone too long, or "".

    The limit is the start timeout: a trainer process may be restarting.
    """
    t, p = state.trainer, state.policy
    if t.attached or t.detached_since is None:
        return ""
    detached_for = now - t.detached_since
    limit = max(p.start_timeout_seconds, p.elastic_timeout_seconds)
    if detached_for < limit:
        return ""
    return f"the trainer's link has been gone for {detached_for:.0f} s (limit {limit:g} s)"


def suspected_hang(state: State, now: float) -> str:
    """Why the trainer looks hung (RUNNING, no step report for long), or "".

    A trainer that was stepping and then lost its link is judged by the same limit, counted from
    the later of its last step and the link's loss: a frozen process's link drops once its
    keepalives go unanswered, and the start timeout would leave it unjudged for long.
    """
    t = state.trainer
    if t.last_step_at is None or not t.step_seconds or (not t.attached and t.detached_since is None):
        return ""
    ordered = sorted(t.step_seconds)
    median = ordered[len(ordered) // 2]
    limit = max(state.policy.hang_min_seconds, state.policy.hang_step_factor * median)
    silent = now - t.last_step_at
    if t.attached or t.detached_since is None:
        if silent < limit:
            return ""
        return f"no step report for {silent:.0f} s (median step {median:.3g} s, limit {limit:g} s): suspected hang"
    if now - max(t.last_step_at, t.detached_since) < limit:
        return ""
    return (
        f"the trainer's link has been gone for {now - t.detached_since:.0f} s and no step report for {silent:.0f} s "
        f"(median step {median:.3g} s, limit {limit:g} s from the later): suspected hang"
    )
