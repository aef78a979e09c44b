"""What the trainer's reports change: it attaches, steps, errs, holds, resumes, flushes or finishes."""

from __future__ import annotations

from agent.core.drains import drain_hold, with_save
from agent.core.evaluate import evaluate
from agent.core.model import (
    Decision,
    ExitCoordinator,
    HoldTrainer,
    Phase,
    Policy,
    State,
    TellWorkers,
    TrainerAttached,
    TrainerDetached,
    TrainerFinished,
    TrainerFlushed,
    TrainerHeld,
    TrainerResumed,
    TrainerSliceError,
    TrainerStepped,
    TrainerView,
    _frozen,
)
from agent.core.stragglers import replacements
from agent.core.transitions import cannot_shrink, draining, fail, fmt, replace, restart, start_hold

RECENT_STEPS = 15
"""Step durations kept for the median that judges a suspected hang."""


def trainer_attached(state: State, ev: TrainerAttached, now: float) -> Decision:
    policy, note = _settings(state, ev)
    t = replace(
        state.trainer,
        attached=True,
        generation=ev.generation,
        step_in_memory=ev.step_in_memory,
        last_step=max(state.trainer.last_step, ev.step_in_memory),
        committed_step=max(state.trainer.committed_step, ev.committed_step),
        active=ev.active,
        surviving=ev.active if ev.step_in_memory >= 0 else frozenset(),
        # A trainer with a resume pending may never have got it: treat it as
        # held so the resume goes out again (evaluate, RUNNING).
        held=ev.held or state.trainer.resume_pending,
        detached_since=None,
        last_step_at=now,
    )
    new = replace(state, policy=policy, trainer=t)
    held = ", held" if ev.held else ""
    reason = f"trainer attached (generation {ev.generation}, step {ev.step_in_memory}{held}){note}"
    blind_next_to_trainer = state.phase == Phase.STARTING and ev.generation > 0 and ev.step_in_memory >= 0
    if blind_next_to_trainer and ev.active and not ev.held:
        return _adopt_running(state, new, ev, now, reason)
    if blind_next_to_trainer and ev.held:
        return _adopt_held(state, new, ev, now, reason)
    if state.phase == Phase.HOLDING:
        # It may not have seen the hold: send it again.
        hold = HoldTrainer(
            state.generation,
            state.hold_flush,
            state.hold_down,
            state.hold_reason,
            state.hold_snapshot,
            state.hold_prepare_wait,
        )
        return Decision(new, (hold,), reason + "; repeating the pending hold")
    if state.phase == Phase.RUNNING and (ev.generation != state.generation or ev.active != state.active):
        # A restarted trainer (or coordinator): bring both onto a fresh generation.
        return start_hold(new, now, reason + "; trainer and coordinator disagree, re-synchronising", failure=False)
    return evaluate(new, now, reason)


def _settings(state: State, ev: TrainerAttached) -> tuple[Policy, str]:
    """The policy after the trainer's settings, and a note on what became of them."""
    policy, s = state.policy, ev.settings
    if s is None:
        return policy, ""
    wanted = (s.elastic_min_slice_count, s.elastic_timeout_seconds, s.elastic_max_retries)
    if wanted == (policy.elastic_min_slice_count, policy.elastic_timeout_seconds, policy.elastic_max_retries):
        return policy, ""
    named = (
        f"elastic_min_slice_count={s.elastic_min_slice_count} "
        f"elastic_timeout_seconds={s.elastic_timeout_seconds:g} elastic_max_retries={s.elastic_max_retries}"
    )
    if state.phase != Phase.STARTING:
        # The policy is fixed once the job has started: a link that could
        # rewrite it mid-run could also talk the job out of its retries.
        return policy, f"; refused the trainer's settings {named}: the policy cannot change after the job started"
    try:
        return policy.with_trainer_settings(*wanted), f"; adopted trainer settings {named}"
    except ValueError as e:
        return policy, f"; kept sidecar settings, trainer's are invalid: {e}"


def _missing_hosts(state: State) -> frozenset[tuple[int, int]]:
    p = state.policy
    return frozenset((sl, h) for sl in range(p.num_slices) for h in range(p.hosts_per_slice)) - set(state.hosts)


def _adopt_running(state: State, new: State, ev: TrainerAttached, now: float, reason: str) -> Decision:
    """A coordinator that starts blind next to a trainer that is training adopts what it runs on.

    Stopping it would cost a recovery; every host gets the rejoin grace instead.
    """
    p = new.policy
    missing = _missing_hosts(new)
    running = replace(
        new,
        phase=Phase.RUNNING,
        generation=max(state.generation, ev.generation),
        active=ev.active & p.all_slices,
        deadline=None,
        expected_rejoin=missing,
        rejoin_deadline=now + p.rejoin_grace_seconds if missing else None,
    )
    return evaluate(running, now, reason + "; adopting the running trainer's generation and slices")


def _adopt_held(state: State, new: State, ev: TrainerAttached, now: float, reason: str) -> Decision:
    """Blind, next to a trainer blocked in a hold: wait with it instead of a full start-up wait.

    Above its generation, so a resume reaches it whatever it waits for.
    """
    p = new.policy
    missing = _missing_hosts(new)
    waiting = replace(
        new,
        phase=Phase.WAITING,
        generation=max(state.generation, ev.generation) + 1,
        active=ev.active & p.all_slices,
        hold_down=p.all_slices - ev.active,
        # Its held step is already durable: a slice found missing later
        # needs no second flush (nor a new hold that restarts the wait).
        hold_flush=ev.committed_step >= ev.step_in_memory,
        deadline=now + p.elastic_timeout_seconds,
        expected_rejoin=missing,
        # The wait is bounded by its own timeout: a host that has not come
        # back within it is not waited for longer because it might rejoin.
        rejoin_deadline=now + min(p.rejoin_grace_seconds, p.elastic_timeout_seconds) if missing else None,
    )
    return evaluate(waiting, now, reason + "; adopting the held trainer, waiting for its slices")


def trainer_detached(state: State, ev: TrainerDetached, now: float) -> Decision:
    t = replace(state.trainer, attached=False, detached_since=now)
    return Decision(replace(state, trainer=t), (), "trainer link closed; waiting for it to re-attach")


def trainer_stepped(state: State, ev: TrainerStepped, now: float) -> Decision:
    recent = (*state.trainer.step_seconds, ev.seconds)[-RECENT_STEPS:] if ev.seconds > 0 else ()
    t = replace(
        state.trainer,
        last_step=max(state.trainer.last_step, ev.step),
        last_step_at=now,
        step_seconds=recent or state.trainer.step_seconds,
        held=False,
    )
    return Decision(replace(state, trainer=t), (), f"trainer completed step {ev.step}")


def trainer_flushed(state: State, ev: TrainerFlushed, now: float) -> Decision:
    t = replace(state.trainer, committed_step=max(state.trainer.committed_step, ev.committed_step))
    if not ev.flush_error:
        t = with_save(t, ev.flush_bytes, ev.flush_seconds)
    if ev.flush_error:
        why = f"trainer flush failed ({ev.flush_error[:200]}); newest committed step {t.committed_step}"
        return Decision(replace(state, trainer=t), (), why)
    return Decision(replace(state, trainer=t), (), f"trainer committed step {ev.committed_step}")


def trainer_finished(state: State, ev: TrainerFinished, now: float) -> Decision:
    done = replace(state, phase=Phase.COMPLETED, deadline=None, exit_code=0)
    actions = (TellWorkers(state.generation, "completed", "training finished"), ExitCoordinator(0, "training finished"))
    return Decision(done, actions, f"training finished at step {ev.step}")


def trainer_slice_error(state: State, ev: TrainerSliceError, now: float) -> Decision:
    named = ev.slices & state.policy.all_slices
    if ev.generation >= state.generation:
        marks = dict.fromkeys(named, now)
    else:
        # An older report may predate a replacement that already registered, so it marks only a slice
        # still out, dated at that mark: the same loss, seen by the trainer after a host's timeout.
        marks = {s: state.slice_errors[s] for s in named if s in state.slice_errors}
    new = replace(
        state,
        slice_errors=_frozen({**state.slice_errors, **marks}),
        trainer_errors=_frozen({**state.trainer_errors, **marks}),
    )
    which = fmt(named) if named else "(slices unknown)"
    reason = f"trainer reported slice loss {which} at step {ev.step}: {ev.message[:120]}"
    if cannot_shrink(state) and state.phase in (Phase.RUNNING, Phase.HOLDING):
        return restart(new, reason)
    if state.phase == Phase.RUNNING and ev.generation >= state.generation and not named & state.active:
        # The trainer is stuck in its error handler and waits for a new generation even if we cannot
        # tell which slice failed. Not knowing which, do not resume on the same slices at once: the
        # host behind it is usually found within unnamed_error_wait_seconds, inside this recovery.
        wait = state.policy.unnamed_error_wait_seconds
        until = now + wait if not named and wait > 0 else None
        return start_hold(replace(new, unnamed_error_until=until), now, reason, failure=True)
    return evaluate(new, now, reason)


def trainer_held(state: State, ev: TrainerHeld, now: float) -> Decision:
    if state.phase == Phase.RUNNING and ev.generation == state.generation and not state.trainer.resume_pending:
        # Held at our generation with no resume of it outstanding, so this coordinator never sent that
        # hold: it started blind while a hold of the previous process was on its way. Nothing would
        # resume it, so re-synchronise as when the trainer is ahead (decide()).
        why = (
            f"trainer held at step {ev.step} for generation {ev.generation}, a hold this coordinator did not send; "
            "re-synchronising"
        )
        return start_hold(replace(state, trainer=_held_at(state, ev)), now, why, failure=False)
    if state.phase != Phase.HOLDING or ev.generation != state.generation:
        why = f"stale hold acknowledgement for generation {ev.generation} (now {state.generation}) ignored"
        return Decision(state, (), why)
    if ev.disagreement:
        return fail(state, f"trainer processes held at different steps ({ev.disagreement}): they cannot resume")
    deadline = now + state.policy.elastic_timeout_seconds
    held = _held_at(state, ev)
    if not ev.flush_error:
        held = with_save(held, ev.flush_bytes, ev.flush_seconds)
    waiting = replace(state, phase=Phase.WAITING, trainer=held, deadline=deadline)
    committed = f", committed step {ev.committed_step}" if ev.committed_step >= 0 else ""
    failed = f"; its flush failed ({ev.flush_error[:200]})" if ev.flush_error else ""
    return evaluate(waiting, now, f"trainer held at step {ev.step}{committed}{failed}")


def _held_at(state: State, ev: TrainerHeld) -> TrainerView:
    return replace(
        state.trainer,
        step_in_memory=ev.step,
        last_step=max(state.trainer.last_step, ev.step),
        committed_step=max(state.trainer.committed_step, ev.committed_step),
        held=True,
    )


def trainer_resumed(state: State, ev: TrainerResumed, now: float) -> Decision:
    if ev.generation != state.generation:
        return Decision(state, (), f"stale resume acknowledgement for generation {ev.generation} ignored")
    t = replace(
        state.trainer,
        generation=ev.generation,
        active=ev.active,
        surviving=ev.active,
        step_in_memory=ev.step,
        resume_pending=False,
        held=False,
        last_step_at=now,
    )
    why = f"trainer resumed at step {ev.step} on slices {fmt(ev.active)} from {ev.restored_from}"
    new = replace(state, trainer=t)
    # The acknowledgement names the mesh the trainer built (MaxText builds its own
    # from Pathways' view): check it against the decision.
    extra, idle = ev.active - state.active, state.active - ev.active
    if extra:
        # Training on a slice that was not decided (drained, or not repaired
        # yet): take it out again with a hold that costs no retry.
        why += f"; mesh mismatch: slice(s) {fmt(extra)} in use but not decided (decided {fmt(state.active)})"
        if extra & draining(state):
            return drain_hold(new, now, why, extra & draining(state))
        return start_hold(new, now, why, failure=False)
    if idle:
        why += f"; mesh mismatch: decided slice(s) {fmt(idle)} not in the trainer's mesh"
    new, replacing = replacements(new, ev.active)
    if replacing:
        why += f"; replacing straggler slice(s) {fmt(frozenset(a.slice for a in replacing))} (--straggler-replace)"
    return Decision(new, replacing, why)
