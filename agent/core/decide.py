"""The pure decision core: ``decide(state, event, now) -> Decision``.

No I/O, no clock, no randomness: the same inputs always give the same
decision, so every edge case is a unit test of a few lines and the ``reason``
goes straight into logs and dashboards (after torchft's ``quorum_compute``).

States and transitions::

                 all slices up + trainer attached
    STARTING ──────────────────────────────────────────► RUNNING ◄─────────┐
       │ deadline passed, too few slices                 │  │              │
       ▼                                                 │  │ a slice of   │ enough slices
     FAILED ◄── retries exhausted ───────────────────────┘  │ `active` goes│ up (resume on
       ▲                                                    │ down, or a   │ exactly them)
       │ ack deadline passed           ┌────────────────────┘ slice comes  │
       │                               ▼                      back (grow)  │
       ├─────────────────────────── HOLDING ── HeldAck ──► WAITING ────────┘
       │                                                     │
       └──────────────── deadline passed, too few slices ────┘

    RUNNING ── TrainerFinished ──► COMPLETED

* ``generation`` counts configurations. Every hold starts a new one; the
  resume that ends a hold carries the same generation, and the trainer ignores
  any command older than the newest it has acted on. It never decreases.
* A slice is *up* when every one of its hosts is registered and healthy and the
  trainer has not reported it lost since (a replacement host clears that).
* A hold flushes (Orbax save + wait) unless training can continue at once on
  the survivors from memory; resuming uses surviving replicas' memory when the
  trainer still holds its state, else the newest committed checkpoint.
* ``elastic_max_retries`` recoveries from failures are allowed (the flag read
  by its name: N + 1 attempts, the first included); the failure after them is
  terminal. Growing back onto a returned slice, a drain and a
  re-synchronisation are not failures and use no retry.
* A slice error that names no slice holds (one recovery) but does not resume
  on unchanged slices for ``unnamed_error_wait_seconds``: the host behind it is
  usually found within that wait, inside the same recovery.
* A command the trainer may have missed (sent while its link was down) is sent
  again when it re-attaches: the pending hold, or a resume it has not
  acknowledged. A trainer reporting a generation above the coordinator's (an
  earlier coordinator process, restarted without its state file, sent it) is
  brought onto a generation above it: a fresh start starts there, anything
  else holds again.
* A notice is never a failure: only a host actually lost is. A disruption due
  now drains its slice at the step boundary with a flush; one announced for
  later is planned for its start minus ``notice_lead_seconds`` and begins on
  the Tick that reaches it; a newer notice moves the plan, a completed or
  cancelled one lifts the drain or the plan. A notice must be current: one
  whose disruption was to be over ``NOTICE_STALE_SECONDS`` ago while its
  node's hosts are up and healthy is ignored, and a notice's drain of hosts
  still up and healthy that long after is lifted. An operator's
  ``undrain --force`` lifts any drain.
* Terminal failure: the trainer is told to abort with exit code 42 (xpk
  restarts on it) after flushing, and the coordinator exits 42 too. The Orbax
  directory keeps the last committed checkpoint for the restart to restore.

Membership and the coordinator's own failures (issue "never make a failure worse"):

* Every observation of a host names the registration it is about (one Join
  stream; the coordinator numbers them): a stream's end, a check's result or a
  health report about an older registration than the host's current one is
  stale and dropped, never applied to the newer one.
* Lost means lost: a host is lost when a check of the host itself fails (its
  Pathways worker's health, checked by the coordinator when the sidecar's
  stream ends or its heartbeats stop), when its sidecar stays away past
  ``rejoin_grace_seconds``, or when its sidecar reports it unhealthy. A host
  whose sidecar was paused, restarted or cut off while its Pathways worker
  still answered (``WorkerAway``) stays up, and its sidecar coming back (the
  same process or a new incarnation) is neither a loss nor a repair: no hold,
  no attempt spent.
* A lost host marks its slice; a host that registered after the mark and has
  stayed registered and healthy for ``settle_seconds`` repairs it: a new
  incarnation, or the very process declared lost coming back (a hung host
  that woke up) unless it is flapping: a host declared lost ``flap_losses``
  times within ``flap_window_seconds`` repairs nothing by coming back, only a
  new incarnation does. A slice the trainer named in a slice error needs every
  one of its hosts registered after the error and settled: the trainer does
  not say which host failed, so one host lost and back proves nothing of the others.
* One host, one voice: a new incarnation over a live record is a second sidecar
  claiming the host (a stale pod beside its replacement), not a loss: the newer
  registration speaks for the host (the coordinator refuses the older one while
  the newer is live, and checks the host itself first when the older had gone
  silent). The incarnation it took over from coming back is reported as
  flapping. Only after a coordinator restart, from another node, is a new
  incarnation the loss of the old one: nobody could check the old host.
* After a coordinator restart (:mod:`agent.statefile`) the hosts it knew get
  ``rejoin_grace_seconds`` in every phase before anyone is judged, counted
  from the newest re-registration while they keep coming back (a storm of
  10,000 reconnections outlasts any fixed grace; in a hold or a wait never past
  the phase's deadline); those that did not come back are then lost. A coordinator that starts blind (no state
  file) adopts a trainer that is training (its generation and slices) or one
  that is held (waiting with it, above its generation) instead of starting over.
* Nothing waits for ever: RUNNING with no step report for ``hang_step_factor``
  times the median step (at least ``hang_min_seconds``) is a suspected hang
  (a hold with flush, as a failure), and so is a trainer that was stepping and
  lost its link, counted from the later of its last step and the link's loss;
  a trainer link gone longer than the start timeout fails the job, holding too; a flushing hold is acknowledged within
  ``elastic_timeout_seconds + flush_timeout_seconds``; a second loss while held
  without a flush re-plans with one when the survivors cannot go on.
* The policy is the trainer's flags at start and is fixed from then on; an
  operator drain that would leave fewer than ``min_slices`` is refused.

Multi-controller jobs (``Policy.trainer_processes`` > 1: one JAX process per
host, joined by ``jax.distributed``) cannot shrink: every slice is needed.

* An active slice lost without notice (a host killed or hung, a slice error,
  a suspected hang) fails the job at once with exit code 42: the surviving
  processes are blocked in a collective, so there is nothing to hold or flush;
  the trainer hooks end them and the JobSet restarts the job, which restores
  the newest committed checkpoint. No elastic retry is spent.
* An announced loss (a drain) holds with a flush, as for any job; once every
  process has held at the agreed step (the coordinator's trainer group checks
  that) and the flush committed, a job drained for a window announced for
  later waits while the drained slices' hosts are still up, until just before
  the window (at most the elastic timeout): a cancelled window resumes every
  process at the held step. Otherwise (an imminent notice, the time passed, a
  host gone, a flush not committed) the job fails with exit code 42: the
  restart resumes from the flushed step.
* Processes that held at different steps never resume: the job fails (42).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace as _replace
from typing import Any

from agent.constants import EXIT_ABORTED, EXIT_RESTART
from agent.core.model import (
    AbortTrainer,
    Decision,
    Drain,
    Event,
    ExitCoordinator,
    FlushTrainer,
    HoldTrainer,
    HostKey,
    HostRecord,
    NodeNotice,
    OperatorCommand,
    Phase,
    ResumeSource,
    ResumeTrainer,
    State,
    TellWorkers,
    Tick,
    TrainerAttached,
    TrainerDetached,
    TrainerFinished,
    TrainerFlushed,
    TrainerHeld,
    TrainerResumed,
    TrainerSliceError,
    TrainerStepped,
    TrainerView,
    WorkerAway,
    WorkerHealth,
    WorkerJoined,
    WorkerLost,
    _frozen,
)


def replace(obj: Any, _slices: Iterable[int] | None = None, **changes: Any) -> Any:
    """:func:`dataclasses.replace`; a new State carries its parent's up slices over
    (:meth:`State.carry_up`), ``_slices`` naming the slices whose hosts changed."""
    new = _replace(obj, **changes)
    if isinstance(obj, State):
        new.carry_up(obj, _slices)
    return new


RECENT_STEPS = 15
"""Step durations kept for the median that judges a suspected hang."""
MC_NOTICE_EXIT_MARGIN = 5.0
"""Multi-controller: seconds before an announced node goes at which a held job stops waiting for a
cancellation and restarts (every process exits 42 itself, not with its host)."""
_MC_CANNOT_SHRINK = "; a multi-controller job cannot continue without it: restart (the JobSet restarts on 42)"
NOTICE_STALE_SECONDS = 600.0
"""Seconds past an announced disruption's end after which a node still up and healthy has come through it.

The end is the window's end where the notice gives one (GCE ``windowEndTime``: "the time by which the
maintenance disruption will be completed", Compute Engine API ``UpcomingMaintenance``), else when the node
was to go (a preemption's 30 s, a host maintenance's 60 s: FACTS section 4). A node up and healthy that long
after it either was never disrupted or already came back, so a notice that old is logged and counted
(``events_ignored_total{reason="stale"}``), not acted on, and a notice's drain of such a node is lifted. The
margin covers clock skew, a window that runs over, and a replaced host's sidecar registering (which lifts the
drain itself); Pub/Sub redelivers for days (its retention), so a bound is what keeps a replayed notice out."""


def _fmt(slices: frozenset[int] | set[int]) -> str:
    return "[" + ",".join(str(s) for s in sorted(slices)) + "]"


def decide(state: State, event: Event, now: float) -> Decision:
    """Turn one event into the next state, the actions to take and why."""
    if state.phase == Phase.FAILED and isinstance(event, TrainerAttached):
        # A trainer that attaches late (it was starting, or its link was down)
        # must learn the job failed, or it would wait for a start forever.
        code = state.exit_code if state.exit_code is not None else EXIT_RESTART
        why = f"job failed; telling the trainer that attached to abort with exit code {code}"
        return Decision(state, (AbortTrainer(state.generation, why, code),), why)
    if state.phase.terminal and not isinstance(event, (WorkerJoined, WorkerLost, WorkerAway, WorkerHealth)):
        why = f"job is {state.phase}; {type(event).__name__} ignored"
        return Decision(state, (), why, rejected=why if isinstance(event, OperatorCommand) else "")
    ahead = getattr(event, "generation", -1)
    if ahead <= state.generation:
        return _dispatch(state, event, now)
    # The trainer acted on a newer generation than ours: an earlier coordinator
    # process (restarted without its state file) sent it. It ignores commands
    # older than that, so carry on above it: a fresh start simply starts above
    # it; a running job re-synchronises with a hold.
    if state.phase == Phase.STARTING:
        return _dispatch(replace(state, generation=ahead), event, now)
    d = _dispatch(state, event, now)
    if d.state.phase.terminal:
        return d
    behind = replace(d.state, generation=max(d.state.generation, ahead))
    why = f"{d.reason}; the trainer is at generation {ahead}, ahead of this coordinator, re-synchronising"
    return _start_hold(behind, now, why, failure=False)


def _dispatch(state: State, event: Event, now: float) -> Decision:
    match event:
        case WorkerJoined():
            return _worker_joined(state, event, now)
        case WorkerLost():
            return _worker_lost(state, event, now)
        case WorkerAway():
            return _worker_away(state, event, now)
        case WorkerHealth():
            return _worker_health(state, event, now)
        case TrainerAttached():
            return _trainer_attached(state, event, now)
        case TrainerDetached():
            t = replace(state.trainer, attached=False, detached_since=now)
            return Decision(replace(state, trainer=t), (), "trainer link closed; waiting for it to re-attach")
        case TrainerStepped():
            recent = (*state.trainer.step_seconds, event.seconds)[-RECENT_STEPS:] if event.seconds > 0 else ()
            t = replace(
                state.trainer,
                last_step=max(state.trainer.last_step, event.step),
                last_step_at=now,
                step_seconds=recent or state.trainer.step_seconds,
                held=False,
            )
            return Decision(replace(state, trainer=t), (), f"trainer completed step {event.step}")
        case TrainerSliceError():
            return _trainer_slice_error(state, event, now)
        case TrainerHeld():
            return _trainer_held(state, event, now)
        case TrainerResumed():
            return _trainer_resumed(state, event, now)
        case TrainerFlushed():
            t = replace(state.trainer, committed_step=max(state.trainer.committed_step, event.committed_step))
            if event.flush_error:
                why = f"trainer flush failed ({event.flush_error[:200]}); newest committed step {t.committed_step}"
                return Decision(replace(state, trainer=t), (), why)
            return Decision(replace(state, trainer=t), (), f"trainer committed step {event.committed_step}")
        case TrainerFinished():
            done = replace(state, phase=Phase.COMPLETED, deadline=None, exit_code=0)
            return Decision(
                done,
                (
                    TellWorkers(state.generation, "completed", "training finished"),
                    ExitCoordinator(0, "training finished"),
                ),
                f"training finished at step {event.step}",
            )
        case NodeNotice():
            return _node_notice(state, event, now)
        case OperatorCommand():
            return _operator(state, event, now)
        case Tick():
            return _evaluate(state, now, "")
    raise TypeError(f"decide() got an unknown event {event!r}")


# --------------------------------------------------------------------------
# membership
# --------------------------------------------------------------------------


def _worker_joined(state: State, ev: WorkerJoined, now: float) -> Decision:
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
    errors = state.slice_errors
    settle = state.policy.settle_seconds <= 0
    reg = ev.registration
    # The incarnation this one took over from, back again: two sidecars claim the host.
    flap = old is not None and old.incarnation != ev.incarnation and old.rival == ev.incarnation
    if old is not None and old.incarnation == ev.incarnation:
        # The same process again (a stream blip, a coordinator restart): neither
        # a repair nor a loss. It keeps its registration time.
        record = replace(old, node=ev.node, node_pool=ev.node_pool, away_since=None, registration=reg)
        what = "re-registered"
    elif old is not None and old.away_since is not None:
        # Its sidecar restarted while the host's Pathways worker kept answering:
        # the same host, so no loss and no repair.
        record = replace(
            old,
            incarnation=ev.incarnation,
            node=ev.node,
            node_pool=ev.node_pool,
            away_since=None,
            registration=reg,
            rival=old.incarnation,
        )
        what = f"sidecar restarted (was incarnation {old.incarnation}; the host stayed up)"
    elif old is not None and key in state.expected_rejoin and ev.node and ev.node == old.node:
        # A new sidecar on the same node while this coordinator was down (it restarted): nobody
        # saw the old one go, and the new one registers only once its host's Pathways worker
        # serves, so the host stayed; a sidecar restart is no loss (a different node would be).
        record = replace(
            old,
            incarnation=ev.incarnation,
            node_pool=ev.node_pool,
            away_since=None,
            healthy=True,
            registration=reg,
            rival=old.incarnation,
        )
        what = f"sidecar restarted while the coordinator was down (was incarnation {old.incarnation}; same node)"
    elif state.lost_incarnations.get(key) == ev.incarnation:
        # The very process declared lost (a hung host that woke up, a host whose check failed
        # for a while). It serves again; it repairs its slice once registered and healthy for
        # settle_seconds, like a replacement, unless it is flapping.
        losses = _recent_losses(state, key, now)
        if len(losses) >= state.policy.flap_losses:
            mark = min(state.slice_errors.get(ev.slice, now), state.trainer_errors.get(ev.slice, now))
            record = HostRecord(ev.incarnation, ev.node, ev.node_pool, mark - 1.0, True, now, settle, None, reg)
            what = (
                f"came back after it was declared lost {len(losses)} times in "
                f"{state.policy.flap_window_seconds:g} s (flapping: not a repair; only a new incarnation is)"
            )
        else:
            record = HostRecord(ev.incarnation, ev.node, ev.node_pool, now, True, now, settle, None, reg)
            what = "came back after it was declared lost (repairs its slice once healthy for the settle time)"
    elif old is not None and key in state.expected_rejoin:
        # A restarted coordinator's record, and a new sidecar on another node: nobody could check the
        # old host (this coordinator was down when it went), and a pod on another node is what a
        # replacement of a lost host looks like. Count the old one as lost until the new one settles.
        record = HostRecord(ev.incarnation, ev.node, ev.node_pool, now, True, now, settle, None, reg)
        errs = dict(errors)
        errs[ev.slice] = now - 1e-6
        errors = _frozen(errs)
        what = f"replaced live incarnation {old.incarnation} on another node (the old one counts as lost)"
    elif old is not None and (ev.slice in errors or ev.slice in state.trainer_errors or ev.slice in state.drains):
        # The slice is out already (an error or a drain not yet repaired): a new sidecar for one of its
        # hosts is what a replacement looks like, and it costs nothing, so it may repair the slice once
        # settled, as any host registered after the mark.
        record = HostRecord(ev.incarnation, ev.node, ev.node_pool, now, True, now, settle, None, reg, old.incarnation)
        what = f"replaced incarnation {old.incarnation} while its slice was out (repairs it once settled)"
    elif old is not None:
        # A second sidecar claims a host whose sidecar is live: the newer registration speaks for the
        # host (the source ended the older one's stream and refuses it while this one is live). Nobody
        # saw the host fail, and a lost host is a failed check of the host itself, never a second
        # process registering: no loss, no repair (it keeps its registration time).
        healthy = old.healthy
        record = replace(
            old,
            incarnation=ev.incarnation,
            node=ev.node,
            node_pool=ev.node_pool,
            away_since=None,
            healthy=True,
            healthy_since=old.healthy_since if healthy else now,
            settled=old.settled if healthy else settle,
            registration=reg,
            rival=old.incarnation,
        )
        what = (
            f"claimed by a second sidecar, incarnation {ev.incarnation} on {ev.node or '?'}, while incarnation "
            f"{old.incarnation} on {old.node or '?'} was live: the newer one speaks for the host (no loss)"
        )
    else:
        record = HostRecord(ev.incarnation, ev.node, ev.node_pool, now, True, now, settle, None, reg)
        what = "registered"
    if flap and old is not None:
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
        rejoin_deadline=_rejoin_deadline_after(state, key, now),
    )
    if state.phase == Phase.STARTING and ev.generation_seen > state.generation:
        # A coordinator that starts blind learns from the workers where the job was.
        new = replace(new, generation=ev.generation_seen)
    return _evaluate(new, now, f"host {ev.slice}.{ev.host} ({ev.node or '?'}) {what}")


def _about(old: HostRecord | None, ev: WorkerLost | WorkerAway | WorkerHealth) -> bool:
    """The observation is about this very registration (not an older stream of the host)."""
    return old is not None and old.incarnation == ev.incarnation and old.registration == ev.registration


def _recent_losses(state: State, key: HostKey, now: float) -> tuple[float, ...]:
    window = state.policy.flap_window_seconds
    return tuple(t for t in state.host_losses.get(key, ()) if now - t <= window)


def _worker_lost(state: State, ev: WorkerLost, now: float) -> Decision:
    key = (ev.slice, ev.host)
    old = state.hosts.get(key)
    if not _about(old, ev):
        return Decision(
            state,
            (),
            f"stale loss of host {ev.slice}.{ev.host} incarnation {ev.incarnation} "
            f"(registration {ev.registration}) ignored",
        )
    # Marked lost: only a new incarnation that settles brings the slice back.
    errors = dict(state.slice_errors)
    errors[ev.slice] = now
    lost = dict(state.lost_incarnations)
    lost[key] = ev.incarnation
    losses = dict(state.host_losses)
    losses[key] = (*_recent_losses(state, key, now), now)
    new = replace(
        state,
        (ev.slice,),
        hosts=state.hosts.without([key]),
        slice_errors=_frozen(errors),
        lost_incarnations=_frozen(lost),
        host_losses=_frozen(losses),
    )
    return _evaluate(new, now, f"host {ev.slice}.{ev.host} lost ({ev.cause})")


def _worker_away(state: State, ev: WorkerAway, now: float) -> Decision:
    key = (ev.slice, ev.host)
    old = state.hosts.get(key)
    if not _about(old, ev):
        return Decision(
            state,
            (),
            f"stale report about host {ev.slice}.{ev.host} incarnation {ev.incarnation} "
            f"(registration {ev.registration}) ignored",
        )
    assert old is not None
    hosts = state.hosts.with_record(key, replace(old, away_since=now if old.away_since is None else old.away_since))
    detail = f" ({ev.detail})" if ev.detail else ""
    why = (
        f"sidecar of host {ev.slice}.{ev.host} disconnected but its Pathways worker still answers{detail}: "
        "the host stays in the job while its sidecar comes back"
    )
    return Decision(replace(state, (ev.slice,), hosts=hosts), (), why)


def _worker_health(state: State, ev: WorkerHealth, now: float) -> Decision:
    key = (ev.slice, ev.host)
    old = state.hosts.get(key)
    if not _about(old, ev):
        return Decision(state, (), f"health report from unknown host {ev.slice}.{ev.host} ignored")
    assert old is not None
    if old.healthy == ev.healthy:
        return Decision(state, (), f"host {ev.slice}.{ev.host} health unchanged")
    if ev.healthy:
        record = replace(old, healthy=True, healthy_since=now, settled=state.policy.settle_seconds <= 0)
    else:
        record = replace(old, healthy=False, settled=False)
    hosts = state.hosts.with_record(key, record)
    word = "healthy" if ev.healthy else "unhealthy"
    detail = f": {ev.detail}" if ev.detail else ""
    return _evaluate(replace(state, (ev.slice,), hosts=hosts), now, f"host {ev.slice}.{ev.host} {word}{detail}")


# --------------------------------------------------------------------------
# trainer
# --------------------------------------------------------------------------


def _trainer_attached(state: State, ev: TrainerAttached, now: float) -> Decision:
    policy = state.policy
    note = ""
    if ev.settings is not None:
        s = ev.settings
        wanted = (s.elastic_min_slice_count, s.elastic_timeout_seconds, s.elastic_max_retries)
        have = (policy.elastic_min_slice_count, policy.elastic_timeout_seconds, policy.elastic_max_retries)
        if wanted != have and state.phase != Phase.STARTING:
            # The policy is fixed once the job has started: a link that could
            # rewrite it mid-run could also talk the job out of its retries.
            note = (
                f"; refused the trainer's settings elastic_min_slice_count={s.elastic_min_slice_count} "
                f"elastic_timeout_seconds={s.elastic_timeout_seconds:g} elastic_max_retries={s.elastic_max_retries}: "
                "the policy cannot change after the job started"
            )
        elif wanted != have:
            try:
                policy = policy.with_trainer_settings(*wanted)
                note = (
                    f"; adopted trainer settings elastic_min_slice_count={s.elastic_min_slice_count} "
                    f"elastic_timeout_seconds={s.elastic_timeout_seconds:g} elastic_max_retries={s.elastic_max_retries}"
                )
            except ValueError as e:
                note = f"; kept sidecar settings, trainer's are invalid: {e}"
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
        # held so the resume goes out again (see _evaluate, RUNNING).
        held=ev.held or state.trainer.resume_pending,
        detached_since=None,
        last_step_at=now,
    )
    new = replace(state, policy=policy, trainer=t)
    reason = (
        f"trainer attached (generation {ev.generation}, step {ev.step_in_memory}{', held' if ev.held else ''}){note}"
    )
    if state.phase == Phase.STARTING and ev.generation > 0 and ev.step_in_memory >= 0 and ev.active and not ev.held:
        # A coordinator that starts blind (its state file is gone) next to a
        # trainer that is training: adopt what the trainer runs on rather than
        # stopping it, and give every host the rejoin grace.
        p = policy
        missing = frozenset((sl, h) for sl in range(p.num_slices) for h in range(p.hosts_per_slice)) - set(state.hosts)
        running = replace(
            new,
            phase=Phase.RUNNING,
            generation=max(state.generation, ev.generation),
            active=ev.active & p.all_slices,
            deadline=None,
            expected_rejoin=missing,
            rejoin_deadline=now + p.rejoin_grace_seconds if missing else None,
        )
        return _evaluate(running, now, reason + "; adopting the running trainer's generation and slices")
    if state.phase == Phase.STARTING and ev.generation > 0 and ev.step_in_memory >= 0 and ev.held:
        # Blind, next to a trainer blocked in a hold: wait with it (above its
        # generation, so a resume reaches it whatever it waits for) instead of
        # a full start-up wait.
        p = policy
        missing = frozenset((sl, h) for sl in range(p.num_slices) for h in range(p.hosts_per_slice)) - set(state.hosts)
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
        return _evaluate(waiting, now, reason + "; adopting the held trainer, waiting for its slices")
    if state.phase == Phase.HOLDING:
        # It may not have seen the hold: send it again.
        hold = HoldTrainer(state.generation, state.hold_flush, state.hold_down, state.hold_reason)
        return Decision(new, (hold,), reason + "; repeating the pending hold")
    if state.phase == Phase.RUNNING and (ev.generation != state.generation or ev.active != state.active):
        # A restarted trainer (or coordinator): bring both onto a fresh generation.
        return _start_hold(new, now, reason + "; trainer and coordinator disagree, re-synchronising", failure=False)
    return _evaluate(new, now, reason)


def _trainer_slice_error(state: State, ev: TrainerSliceError, now: float) -> Decision:
    errors = dict(state.slice_errors)
    by_trainer = dict(state.trainer_errors)
    named = ev.slices & state.policy.all_slices
    if ev.generation >= state.generation:
        # An older report may predate a replacement that already registered;
        # the trainer will see the newer command and report again if need be.
        for s in named:
            errors[s] = by_trainer[s] = now
    new = replace(state, slice_errors=_frozen(errors), trainer_errors=_frozen(by_trainer))
    reason = f"trainer reported slice loss {_fmt(named) if named else '(slices unknown)'} at step {ev.step}: {ev.message[:120]}"
    if state.policy.multi_controller and state.phase in (Phase.RUNNING, Phase.HOLDING):
        return _fail(new, f"{reason}{_MC_CANNOT_SHRINK}")
    if state.phase == Phase.RUNNING and ev.generation >= state.generation:
        if not named & state.active:
            # The trainer is stuck in its error handler and waits for a new
            # generation even if we cannot tell which slice failed. Not knowing
            # which, do not resume on the same slices at once: the host behind it
            # is usually found within unnamed_error_wait_seconds, inside this
            # recovery rather than as a second one.
            wait = state.policy.unnamed_error_wait_seconds
            until = now + wait if not named and wait > 0 else None
            return _start_hold(replace(new, unnamed_error_until=until), now, reason, failure=True)
    return _evaluate(new, now, reason)


def _trainer_held(state: State, ev: TrainerHeld, now: float) -> Decision:
    if state.phase == Phase.RUNNING and ev.generation == state.generation and not state.trainer.resume_pending:
        # Held at the generation this coordinator runs at with no resume of it
        # outstanding, so it never sent that hold: it started blind while a
        # hold of the previous process was still on its way to the step
        # boundary. Nothing would resume it, so re-synchronise as when the
        # trainer is ahead (see decide()).
        t = replace(
            state.trainer,
            step_in_memory=ev.step,
            last_step=max(state.trainer.last_step, ev.step),
            committed_step=max(state.trainer.committed_step, ev.committed_step),
            held=True,
        )
        why = (
            f"trainer held at step {ev.step} for generation {ev.generation}, a hold this coordinator did not send; "
            "re-synchronising"
        )
        return _start_hold(replace(state, trainer=t), now, why, failure=False)
    if state.phase != Phase.HOLDING or ev.generation != state.generation:
        return Decision(
            state, (), f"stale hold acknowledgement for generation {ev.generation} (now {state.generation}) ignored"
        )
    if ev.disagreement:
        return _fail(state, f"trainer processes held at different steps ({ev.disagreement}): they cannot resume")
    t = replace(
        state.trainer,
        step_in_memory=ev.step,
        last_step=max(state.trainer.last_step, ev.step),
        committed_step=max(state.trainer.committed_step, ev.committed_step),
        held=True,
    )
    waiting = replace(state, phase=Phase.WAITING, trainer=t, deadline=now + state.policy.elastic_timeout_seconds)
    committed = f", committed step {ev.committed_step}" if ev.committed_step >= 0 else ""
    failed = f"; its flush failed ({ev.flush_error[:200]})" if ev.flush_error else ""
    return _evaluate(waiting, now, f"trainer held at step {ev.step}{committed}{failed}")


def _trainer_resumed(state: State, ev: TrainerResumed, now: float) -> Decision:
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
    why = f"trainer resumed at step {ev.step} on slices {_fmt(ev.active)} from {ev.restored_from}"
    new = replace(state, trainer=t)
    # The acknowledgement names the mesh the trainer built (MaxText builds its own
    # from Pathways' view): check it against the decision.
    extra, idle = ev.active - state.active, state.active - ev.active
    if extra:
        # Training on a slice that was not decided (drained, or not repaired
        # yet): take it out again with a hold that costs no retry.
        announced = bool(extra & _draining(state)) or None
        return _start_hold(
            new,
            now,
            f"{why}; mesh mismatch: slice(s) {_fmt(extra)} in use but not decided (decided {_fmt(state.active)})",
            failure=False,
            flush=announced,
        )
    if idle:
        why += f"; mesh mismatch: decided slice(s) {_fmt(idle)} not in the trainer's mesh"
    return Decision(new, (), why)


# --------------------------------------------------------------------------
# the policy: what the current membership means
# --------------------------------------------------------------------------


def _rejoin_deadline_after(state: State, key: HostKey, now: float) -> float | None:
    """The rejoin deadline once the awaited host ``key`` has re-registered at ``now``.

    The grace counts from the newest re-registration, not from the restart: while awaited hosts
    keep coming back, the restarted coordinator (or the network in front of it) is working through
    their reconnections, and one that has not been reached yet is not late. At 10,000 hosts a
    re-registration storm takes longer than any fixed grace worth having; judging the hosts it has
    not read yet lost would take healthy slices out of the job for the coordinator's own backlog.
    A host that does not come back is judged ``rejoin_grace_seconds`` after the last one that did.
    In a hold or a wait the grace never outlasts the phase's own deadline.
    """
    deadline = state.rejoin_deadline
    if deadline is None or now >= deadline or key not in state.expected_rejoin:
        return deadline
    slid = max(deadline, now + state.policy.rejoin_grace_seconds)
    if state.phase in (Phase.HOLDING, Phase.WAITING) and state.deadline is not None:
        slid = min(slid, max(deadline, state.deadline))
    return slid


def _rejoining_slices(state: State, now: float) -> frozenset[int]:
    """Slices with a host still awaited by a restarted coordinator within its rejoin grace."""
    if state.rejoin_deadline is None or now >= state.rejoin_deadline:
        return frozenset()
    return state.expected_rejoin.slices()


def _evaluate(state: State, now: float, why: str) -> Decision:
    """Given membership as it stands, what must happen now."""
    state = _settle(_forget_repaired(state), now)
    state, began = _begin_planned(state, now)
    if began:
        why = f"{why}; {began}" if why else began
    state, lifted = _lift_overdue(state, now)
    if lifted:
        why = f"{why}; {lifted}" if why else lifted
    p = state.policy
    up = state.up_slices()
    prefix = f"{why}; " if why else ""
    # A slice that went down, even briefly, no longer holds a replica. One whose
    # hosts have yet to rejoin a restarted coordinator is not known to be down:
    # the trainer itself skips replicas Pathways reports lost when it reads memory.
    # (Worked out only when a replica is not up: the hosts awaited are every host after a restart, and
    # this runs on each of their re-registrations.)
    if state.trainer.surviving - up:
        rejoining = _rejoining_slices(state, now)
        if state.trainer.surviving - up - rejoining:
            keep = state.trainer.surviving & (up | rejoining)
            state = replace(state, trainer=replace(state.trainer, surviving=keep))

    # Rejoin grace after a coordinator restart: hosts it knew may still come
    # back, so nobody is judged on membership until they have or it has passed.
    if state.expected_rejoin:
        grace = state.rejoin_deadline is not None and now < state.rejoin_deadline
        if grace and state.phase in (Phase.RUNNING, Phase.HOLDING, Phase.WAITING):
            if state.phase == Phase.HOLDING and state.deadline is not None and now >= state.deadline:
                return _fail(state, f"{prefix}trainer did not acknowledge the hold in time")
            return Decision(state, (), f"{prefix}waiting for {len(state.expected_rejoin)} host(s) to rejoin")
        # Hosts that did not come back in time are lost, like any other.
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
        if gone:
            prefix += f"{len(gone)} host(s) did not rejoin within the grace; "
        up = state.up_slices()

    if state.phase == Phase.STARTING:
        if state.trainer.attached and up == p.all_slices:
            return _resume(state, up, f"{prefix}all {p.num_slices} slices up; starting")
        if state.deadline is not None and now >= state.deadline:
            if state.trainer.attached and len(up) >= p.min_slices:
                return _resume(state, up, f"{prefix}start deadline passed; starting on {_fmt(up)}")
            return _fail(
                state,
                f"{prefix}only {len(up)} of {p.num_slices} slices up (trainer attached: {state.trainer.attached}) "
                f"after {max(p.start_timeout_seconds, p.elastic_timeout_seconds):g} s at start",
            )
        return Decision(state, (), f"{prefix}starting: {len(up)} of {p.num_slices} slices up")

    if state.phase == Phase.RUNNING:
        lost = state.active - up
        if lost:
            failed = lost - _draining(state)
            if failed and p.multi_controller:
                return _fail(state, f"{prefix}active slice(s) {_fmt(failed)} down{_MC_CANNOT_SHRINK}")
            if not failed:
                # Announced: drain at the step boundary, flush, lose nothing.
                return _start_hold(
                    state, now, f"{prefix}leaving slice(s) {_fmt(lost)} at the step boundary", failure=False, flush=True
                )
            return _start_hold(state, now, f"{prefix}active slice(s) {_fmt(lost)} down", failure=True)
        t = state.trainer
        if t.attached and t.resume_pending and t.held:
            # It said it is held and has not acknowledged our resume (sent while
            # it was away, lost with the old link, or decided just before this
            # coordinator restarted): send it again, once per report of being held.
            g, active = state.generation, state.active
            again = replace(state, trainer=replace(t, held=False))
            reason = f"{prefix}repeating the unacknowledged resume generation {g} on {_fmt(active)}"
            return Decision(again, (ResumeTrainer(g, active, _source(t, active), reason),), reason)
        if up - state.active and t.attached:
            return _start_hold(state, now, f"{prefix}slice(s) {_fmt(up - state.active)} back; growing", failure=False)
        gone = _link_gone_too_long(state, now)
        if gone:
            return _fail(state, f"{prefix}{gone}")
        hang = _suspected_hang(state, now)
        if hang and p.multi_controller:
            return _fail(state, f"{prefix}{hang}{_MC_CANNOT_SHRINK}")
        if hang:
            return _start_hold(state, now, f"{prefix}{hang}", failure=True, flush=True)
        return Decision(state, (), why or "running")

    if state.phase == Phase.HOLDING:
        if state.deadline is not None and now >= state.deadline:
            limit = p.elastic_timeout_seconds + (p.flush_timeout_seconds if state.hold_flush else 0.0)
            return _fail(state, f"{prefix}trainer did not acknowledge the hold within {limit:g} s")
        # A hold for a trainer whose link is gone (suspected hung) ends no later than that link's own limit.
        gone = _link_gone_too_long(state, now)
        if gone:
            return _fail(state, f"{prefix}{gone}")
        newly_down = (p.all_slices - up) - state.hold_down
        if p.multi_controller and newly_down - _draining(state):
            # A process may now be blocked in a collective instead of reaching the boundary.
            return _fail(
                state, f"{prefix}slice(s) {_fmt(newly_down - _draining(state))} down while holding{_MC_CANNOT_SHRINK}"
            )
        if newly_down:
            # Tell the trainer not to read its state from these slices either.
            # A slice drained by a notice while a hold is pending flushes like one drained while running.
            announced = bool(newly_down & _draining(state)) or None
            return _start_hold(
                state, now, f"{prefix}slice(s) {_fmt(newly_down)} also down", failure=False, flush=announced
            )
        return Decision(state, (), f"{prefix}waiting for the trainer to hold")

    if state.phase == Phase.WAITING:
        if p.multi_controller and up != p.all_slices and not state.operator_hold:
            until = _announced_until(state, p.all_slices - up, now)
            if until is not None:
                return Decision(
                    state,
                    (),
                    f"{prefix}held and flushed at step {state.trainer.step_in_memory}; slice(s) "
                    f"{_fmt(p.all_slices - up)} announced to leave, hosts still up: waiting {until - now:.0f} s "
                    "for the disruption (a cancelled notice resumes every process; a lost host restarts the job)",
                )
            t = state.trainer
            kept = (
                f"the held step {t.step_in_memory} is committed"
                if t.committed_step >= t.step_in_memory
                else f"the held step {t.step_in_memory} is NOT committed (newest committed {t.committed_step})"
            )
            return _fail(state, f"{prefix}slice(s) {_fmt(p.all_slices - up)} out of the job, {kept}{_MC_CANNOT_SHRINK}")
        newly_down = (p.all_slices - up) - state.hold_down
        if newly_down and not state.hold_flush and len(up) < p.min_slices and state.trainer.step_in_memory >= 0:
            # A second loss during a hold that did not flush: memory no longer
            # suffices to go on soon, so make the held step durable now.
            return _start_hold(
                state, now, f"{prefix}slice(s) {_fmt(newly_down)} also down while held", failure=False, flush=True
            )
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
            return _resume(state, up, f"{prefix}{len(up)} of {p.num_slices} slices up (minimum {p.min_slices})")
        if state.deadline is not None and now >= state.deadline:
            return _fail(
                state,
                f"{prefix}only {len(up)} of {p.num_slices} slices up after {p.elastic_timeout_seconds:g} s "
                f"(minimum {p.min_slices})",
            )
        return Decision(state, (), f"{prefix}holding until {p.min_slices} slices are up ({len(up)} now)")

    return Decision(state, (), why)


def _announced_until(state: State, missing: frozenset[int], now: float) -> float | None:
    """Multi-controller, held: how long to keep the hold open for a notice that may still be cancelled.

    Only while every missing slice is drained by a notice of a window announced for later (a
    scheduled GKE/GCE maintenance window, the node's scheduled-maintenance-time label), the
    window's start less ``MC_NOTICE_EXIT_MARGIN`` is still ahead, and every host of the slice is
    still registered and healthy; never past the elastic timeout. Then the held, flushed job waits:
    a cancellation (a ``CANCELLED`` event for the window, or the label removed) lifts the drain and
    the processes resume at the held step; the node actually going ends the wait at once.
    None: restart now.
    """
    ends: list[float] = []
    for s in missing:
        d = state.drains.get(s)
        if d is None or d.source == "operator" or d.starts_at is None:
            # Only a window announced for later may still be cancelled. An imminent notice (a
            # preemption, a maintenance-event, a GCE system event) has at most an estimated
            # deadline (--maintenance/--preemption-notice-seconds): its host may go before it.
            return None
        of = state.hosts.slice_records(s)
        hosts = [of.get(h) for h in range(state.policy.hosts_per_slice)]
        if any(r is None or not r.healthy for r in hosts):
            return None
        ends.append(d.starts_at)
    if not ends or state.trainer.step_in_memory < 0 or state.trainer.committed_step < state.trainer.step_in_memory:
        return None
    # Leave before the node goes, so that every process exits 42 itself rather than with its host.
    until = min(ends) - MC_NOTICE_EXIT_MARGIN
    if state.deadline is not None:
        until = min(until, state.deadline)
    return until if until > now else None


def _link_gone_too_long(state: State, now: float) -> str:
    """Why the trainer's link has been gone too long (the start timeout: a trainer process may be
    restarting), or ""."""
    t, p = state.trainer, state.policy
    if t.attached or t.detached_since is None:
        return ""
    detached_for = now - t.detached_since
    limit = max(p.start_timeout_seconds, p.elastic_timeout_seconds)
    if detached_for < limit:
        return ""
    return f"the trainer's link has been gone for {detached_for:.0f} s (limit {limit:g} s)"


def _suspected_hang(state: State, now: float) -> str:
    """Why the trainer looks hung (RUNNING, no step report for long), or "".

    A trainer that was stepping and then lost its link is judged by the same limit, counted from the later
    of its last step and the link's loss (a reattach window of one limit): a frozen process's link drops
    once its keepalives go unanswered, and the start timeout (meant for a process starting up) would leave
    it unjudged for ten minutes. A link that comes back within the window (a blip, a coordinator restart)
    costs nothing; past it the hold waits for the trainer, sent again when it re-attaches.
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


def _settle(state: State, now: float) -> State:
    """Mark hosts healthy for ``settle_seconds`` as settled (they may repair a lost slice).

    Only hosts of slices with an error or drain mark: ``settled`` matters only to
    whether a host repairs a mark (:meth:`State.slice_up`, :func:`_forget_repaired`),
    and a host that registered before a mark never repairs it. Looking at every
    host at every event made each of 10,000 registrations walk 10,000 hosts.
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


def _start_hold(state: State, now: float, why: str, *, failure: bool, flush: bool | None = None) -> Decision:
    p = state.policy
    retries = state.retries_used
    if failure:
        if retries >= p.max_recoveries:
            return _fail(
                state,
                f"{why}; elastic_max_retries={p.elastic_max_retries} recoveries used up",
            )
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
    down = p.all_slices - up - _rejoining_slices(state, now)
    ack_within = p.elastic_timeout_seconds + (p.flush_timeout_seconds if flush else 0.0)
    new = replace(
        state,
        phase=Phase.HOLDING,
        generation=gen,
        retries_used=retries,
        deadline=now + ack_within,
        hold_flush=flush,
        hold_reason=why,
        hold_down=down,
    )
    note = f" (recovery {retries} of {p.max_recoveries})" if failure else ""
    return Decision(
        new,
        (HoldTrainer(gen, flush, down, why), TellWorkers(gen, "hold", why)),
        f"{why}; hold generation {gen}{' with flush' if flush else ''}{note}",
    )


def _resume(state: State, up: frozenset[int], why: str) -> Decision:
    # The trainer keeps its state in memory if it still has replicas on a
    # slice we resume on and its process did not restart.
    t = state.trainer
    source = _source(t, up)
    gen = state.generation if state.phase != Phase.STARTING else state.generation + 1
    trainer = replace(t, active=up, surviving=up, resume_pending=True, held=False)
    new = replace(state, phase=Phase.RUNNING, generation=gen, active=up, deadline=None, trainer=trainer)
    return Decision(
        new,
        (ResumeTrainer(gen, up, source, why), TellWorkers(gen, "resume", why)),
        f"{why}; resume generation {gen} on {_fmt(up)} from {source}",
    )


def _source(t: TrainerView, up: frozenset[int]) -> ResumeSource:
    from_memory = t.step_in_memory >= 0 and bool(t.surviving & up)
    return ResumeSource.MEMORY if from_memory else ResumeSource.CHECKPOINT


def _fail(state: State, why: str, exit_code: int = EXIT_RESTART) -> Decision:
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


# --------------------------------------------------------------------------
# notices and operators
# --------------------------------------------------------------------------


def _draining(state: State) -> frozenset[int]:
    return frozenset(state.drains)


def _notice_slices(state: State, ev: NodeNotice) -> frozenset[int]:
    if ev.slice is not None:
        return frozenset({ev.slice}) & state.policy.all_slices
    if ev.node:
        return frozenset(s for (s, _), r in state.hosts.items() if r.node == ev.node)
    if ev.node_pool:
        return frozenset(s for (s, _), r in state.hosts.items() if r.node_pool == ev.node_pool)
    return frozenset()


def _node_notice(state: State, ev: NodeNotice, now: float) -> Decision:
    """A notice never counts as a failure: only a host actually lost does.

    Due now (imminent, in progress, or arriving after its window began while the
    node is still up): drain at the step boundary with a flush. Due later: plan
    the drain for ``starts_at - notice_lead_seconds``; a newer notice for the
    same slice moves that plan, a cleared one (completed, cancelled) lifts it.
    Over for longer than ``NOTICE_STALE_SECONDS`` while the hosts are healthy: ignored.
    """
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
    end = _notice_end(ev.ends_at, ev.deadline, ev.starts_at)
    if not ev.cleared and end is not None and now - end > NOTICE_STALE_SECONDS and _hosts_healthy(state, slices):
        return Decision(
            state,
            (),
            f"{label} ignored: the disruption was to be over {now - end:.0f} s ago (more than "
            f"{NOTICE_STALE_SECONDS:g} s) and the hosts of slice(s) {_fmt(slices)} are up and healthy",
            outcome="stale",
        )
    drains, planned = dict(state.drains), dict(state.planned)
    if ev.cleared:
        lifted = {s for s in slices if s in drains and drains[s].source != "operator"}
        unplanned = {s for s in slices if s in planned}
        for s in lifted:
            del drains[s]
        for s in unplanned:
            del planned[s]
        if not lifted and not unplanned:
            return Decision(state, (), f"{label}: nothing was draining", outcome="duplicate")
        parts = [f"drain of {_fmt(lifted)} lifted"] if lifted else []
        parts += [f"planned drain of {_fmt(unplanned)} cancelled"] if unplanned else []
        new_state = replace(state, drains=_frozen(drains), planned=_frozen(planned))
        return _evaluate(new_state, now, f"{label}: {', '.join(parts)}")
    lead = state.policy.notice_lead_seconds
    begin = None if ev.starts_at is None else ev.starts_at - lead
    if ev.starts_at is not None and begin is not None and begin > now:
        # Announced for later: keep training until the lead time before it starts.
        starts_at = ev.starts_at
        changed = {s for s in slices if s not in planned or planned[s].since != begin}
        # A window moved later than a drain it already started: that drain waits too.
        moved_out = {
            s
            for s in slices
            if s in drains and drains[s].source != "operator" and (drains[s].starts_at or starts_at) < starts_at
        }
        if not changed and not moved_out:
            return Decision(state, (), f"{label}: drain of {_fmt(slices)} already planned", outcome="duplicate")
        for s in slices:
            planned[s] = Drain(
                begin, ev.kind, ev.source, ev.reason or label, ev.deadline, ev.node, ev.starts_at, ev.ends_at
            )
        for s in moved_out:
            del drains[s]
        note = f"; drain of {_fmt(moved_out)} lifted until then" if moved_out else ""
        why = (
            f"{label}: starts in {starts_at - now:.0f} s; draining slice(s) {_fmt(slices)} "
            f"in {begin - now:.0f} s ({lead:g} s before){note}"
        )
        return _evaluate(replace(state, drains=_frozen(drains), planned=_frozen(planned)), now, why)
    new = {s for s in slices if s not in drains}
    for s in slices:
        planned.pop(s, None)
    if not new:
        return Decision(
            replace(state, planned=_frozen(planned)),
            (),
            f"{label}: slice(s) {_fmt(slices)} already draining",
            outcome="duplicate",
        )
    for s in new:
        drains[s] = Drain(now, ev.kind, ev.source, ev.reason or label, ev.deadline, ev.node, ev.starts_at, ev.ends_at)
    if ev.starts_at is not None and ev.starts_at <= now:
        left = f" (its window began {now - ev.starts_at:.0f} s ago; the node is still up)"
    elif ev.deadline is not None:
        left = f" ({ev.deadline - now:.0f} s before the deadline)" if ev.deadline > now else " (deadline passed)"
    else:
        left = ""
    new_state = replace(state, drains=_frozen(drains), planned=_frozen(planned))
    return _evaluate(new_state, now, f"{label}: draining slice(s) {_fmt(new)}{left}")


def _begin_planned(state: State, now: float) -> tuple[State, str]:
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
        f"planned drain of slice(s) {_fmt(set(due))} begins{when}"
    )


def _notice_end(ends_at: float | None, deadline: float | None, starts_at: float | None) -> float | None:
    """When an announced disruption is over: its window's end, else when the node was to go (never before
    the window starts)."""
    if ends_at is not None:
        return ends_at
    known = [t for t in (deadline, starts_at) if t is not None]
    return max(known) if known else None


def _hosts_healthy(state: State, slices: Iterable[int]) -> bool:
    """Every host of each of ``slices`` registered and healthy (at least one slice)."""
    seen = False
    for s in slices:
        of = state.hosts.slice_records(s)
        if any((r := of.get(h)) is None or not r.healthy for h in range(state.policy.hosts_per_slice)):
            return False
        seen = True
    return seen


def _lift_overdue(state: State, now: float) -> tuple[State, str]:
    """Lift notice drains whose disruption was to be over ``NOTICE_STALE_SECONDS`` ago while the hosts stayed up.

    Such a disruption did not happen to this node (or is long over): keeping the slice out would cost it for
    good, since no cancellation and no replacement will come.
    """
    overdue = {
        s: end
        for s, d in state.drains.items()
        if d.source != "operator"
        and (end := _notice_end(d.ends_at, d.deadline, d.starts_at)) is not None
        and now - end > NOTICE_STALE_SECONDS
        and _hosts_healthy(state, (s,))
    }
    if not overdue:
        return state, ""
    drains = {s: d for s, d in state.drains.items() if s not in overdue}
    ago = max(now - end for end in overdue.values())
    return replace(state, drains=_frozen(drains)), (
        f"notice drain of slice(s) {_fmt(set(overdue))} lifted: the disruption was to be over up to {ago:.0f} s "
        f"ago (more than {NOTICE_STALE_SECONDS:g} s) and every host of it is still up and healthy"
    )


def _operator(state: State, ev: OperatorCommand, now: float) -> Decision:
    why = f"operator {ev.kind}: {ev.reason}"

    def refuse(text: str) -> Decision:
        return Decision(state, (), f"{why} refused: {text}", rejected=text)

    match ev.kind:
        case "hold":
            if state.phase == Phase.STARTING:
                return refuse("the job has not started yet")
            if state.phase == Phase.RUNNING:
                return _start_hold(replace(state, operator_hold=True), now, why, failure=False, flush=True)
            held = replace(state, operator_hold=True, deadline=None if state.phase == Phase.WAITING else state.deadline)
            # The trainer, held for a failure, bounds its wait for a decision (elastic_timeout_seconds and a
            # grace: trainer_hooks/session.py); an operator hold has no such bound. Tell it that an operator
            # holds it now: the same generation again, no flush (it is held already).
            tell = (
                (HoldTrainer(state.generation, False, state.hold_down, why),)
                if state.phase in (Phase.HOLDING, Phase.WAITING)
                else ()
            )
            return Decision(held, tell, f"{why}; already holding, will stay held until an operator resumes")
        case "resume":
            if not state.operator_hold:
                return refuse(f"the job is {state.phase} and not held by an operator")
            deadline = now + state.policy.elastic_timeout_seconds if state.phase == Phase.WAITING else state.deadline
            return _evaluate(replace(state, operator_hold=False, deadline=deadline), now, why)
        case "drain":
            s = ev.slice
            if s is None or s not in state.policy.all_slices:
                return refuse(f"slice {s} is not in this job (slices 0..{state.policy.num_slices - 1})")
            if s in state.drains:
                return Decision(state, (), f"{why}; slice {s} is already draining", outcome="duplicate")
            left = state.up_slices() - {s}
            p = state.policy
            if len(left) < p.min_slices:
                # Its hosts stay healthy, so no replacement would ever come: the
                # job would hold until elastic_timeout_seconds and then fail.
                return refuse(
                    f"draining slice {s} would leave {len(left)} slice(s) up, fewer than the {p.min_slices} that "
                    f"elastic_min_slice_count={p.elastic_min_slice_count} requires; a drained host stays healthy, so "
                    "no replacement would come. Lower elastic_min_slice_count, or drain once a spare slice is up"
                )
            drains = dict(state.drains)
            drains[s] = Drain(now, "operator_drain", "operator", ev.reason)
            return _evaluate(replace(state, drains=_frozen(drains)), now, f"{why}; draining slice {s}")
        case "undrain":
            # Undo a drain: the slice counts again, and the job grows back onto it once its
            # hosts are up, as onto any returned slice. A notice's drain is the notice's to
            # lift (its cancellation, its window long over, the host replaced) unless the
            # operator forces it: a notice can be wrong, and nothing else would lift it.
            s = ev.slice
            if s is None or s not in state.policy.all_slices:
                return refuse(f"slice {s} is not in this job (slices 0..{state.policy.num_slices - 1})")
            d = state.drains.get(s)
            plan = state.planned.get(s) if ev.force else None
            if d is None and plan is None:
                return refuse(f"slice {s} is not drained")
            if d is not None and d.source != "operator" and not ev.force:
                return refuse(
                    f"slice {s} was drained by a {d.kind} notice ({d.source}), not by an operator; that drain lifts "
                    "when the notice is cancelled, its window is long over or the host is replaced; "
                    "undrain --force lifts it now"
                )
            drains, planned = dict(state.drains), dict(state.planned)
            drains.pop(s, None)
            planned.pop(s, None)
            forced = [
                f"the {what} from a {x.kind} notice ({x.source})"
                for x, what in ((d, "drain"), (plan, "planned drain"))
                if x is not None and x.source != "operator"
            ]
            note = f"; forced: {' and '.join(forced)} lifted" if forced else ""
            new_state = replace(state, drains=_frozen(drains), planned=_frozen(planned))
            return _evaluate(new_state, now, f"{why}; slice {s} no longer drained{note}")
        case "checkpoint":
            if not state.trainer.attached:
                return refuse("no trainer is attached")
            if state.phase == Phase.STARTING:
                return refuse("the job has not started yet")
            if state.policy.multi_controller:
                # A save is collective: its processes would each save at a different boundary.
                return refuse("a multi-controller job flushes only at an agreed step: hold (it flushes), then resume")
            return Decision(state, (FlushTrainer(state.generation, why),), f"{why}; asking the trainer to flush")
        case "abort":
            return _fail(state, why, EXIT_RESTART if ev.restart else EXIT_ABORTED)
    return refuse(f"unknown operator command {ev.kind!r}")


def _forget_repaired(state: State) -> State:
    """Drop error and drain marks of slices a replacement host has repaired since.

    A repaired slice is up again either way; forgetting the mark means a later
    notice for the replacement drains it anew, and a later loss counts as a
    failure rather than as the old drain.
    """

    def repaired(s: int, mark: float) -> bool:
        # The slice's own hosts only: walking every host for each marked slice made each event after a
        # mass loss (every slice marked) cost slices x hosts (a restart storm at 10,000 hosts stalled for 40 s).
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
