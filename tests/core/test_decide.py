"""Unit tests of the pure decision core: one edge case each, a few lines each."""

from __future__ import annotations

import dataclasses

import pytest

from agent.constants import EXIT_RESTART
from agent.core.decide import decide
from agent.core.model import (
    AbortTrainer,
    ExitCoordinator,
    HoldTrainer,
    HostRecord,
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
    TrainerSettings,
    TrainerSliceError,
    TrainerStepped,
    WorkerHealth,
    WorkerJoined,
    WorkerLost,
    _frozen,
    initial_state,
)
from tests.core.driver import Job, Policy, kinds, of

# --------------------------------------------------------------------------
# start
# --------------------------------------------------------------------------


def test_starts_only_when_every_slice_and_the_trainer_are_up():
    job = Job(Policy(num_slices=2, hosts_per_slice=2))
    job.feed(WorkerJoined(0, 0, "a"))
    job.feed(WorkerJoined(0, 1, "b"))
    assert job.feed(TrainerAttached(0, -1)).actions == ()
    assert job.feed(WorkerJoined(1, 0, "c")).actions == ()
    assert job.state.phase == Phase.STARTING
    d = job.feed(WorkerJoined(1, 1, "d"))
    assert d.state.phase == Phase.RUNNING
    assert kinds(d) == [ResumeTrainer, TellWorkers]
    (resume,) = of(d, ResumeTrainer)
    assert (resume.generation, resume.active, resume.source) == (1, frozenset({0, 1}), ResumeSource.CHECKPOINT)
    assert d.state.generation == 1 and d.state.active == frozenset({0, 1})


def test_slices_up_without_trainer_do_not_start():
    job = Job(Policy(num_slices=2))
    d = job.join_all()
    assert d.state.phase == Phase.STARTING and d.actions == ()
    assert job.feed(TrainerAttached(0, -1)).state.phase == Phase.RUNNING


def test_start_deadline_with_too_few_slices_fails():
    job = Job(Policy(num_slices=2, elastic_timeout_seconds=30, start_timeout_seconds=10))
    job.feed(WorkerJoined(0, 0, "a"))
    job.feed(TrainerAttached(0, -1))
    assert job.feed(Tick(), dt=29).state.phase == Phase.STARTING  # start waits max(start, elastic) timeout
    d = job.feed(Tick(), dt=1)
    assert d.state.phase == Phase.FAILED
    assert of(d, AbortTrainer)[0].exit_code == 42


def test_start_waits_for_process_start_up_longer_than_a_short_elastic_timeout():
    job = Job(Policy(num_slices=2, elastic_timeout_seconds=3))
    job.feed(WorkerJoined(0, 0, "a"))
    assert job.feed(Tick(), dt=60).state.phase == Phase.STARTING
    job.feed(WorkerJoined(1, 0, "b"))
    assert job.feed(TrainerAttached(0, -1)).state.phase == Phase.RUNNING


def test_a_trainer_attaching_after_the_job_failed_is_told_to_abort():
    job = Job(Policy(num_slices=2, elastic_timeout_seconds=30, start_timeout_seconds=30))
    job.feed(WorkerJoined(0, 0, "a"))
    assert job.feed(Tick(), dt=31).state.phase == Phase.FAILED
    d = job.feed(TrainerAttached(0, -1))
    assert d.state.phase == Phase.FAILED and of(d, AbortTrainer)[0].exit_code == 42


def test_start_deadline_starts_on_enough_slices():
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, elastic_timeout_seconds=30, start_timeout_seconds=30))
    job.feed(WorkerJoined(0, 0, "a"))
    job.feed(WorkerJoined(2, 0, "c"))
    job.feed(TrainerAttached(0, -1))
    d = job.feed(Tick(), dt=30)
    assert d.state.phase == Phase.RUNNING
    assert of(d, ResumeTrainer)[0].active == frozenset({0, 2})


# --------------------------------------------------------------------------
# losing a slice
# --------------------------------------------------------------------------


def test_kill_with_min_below_count_holds_without_flush_and_resumes_from_memory_on_survivors():
    job = Job(Policy(num_slices=4, elastic_min_slice_count=2))
    job.start()
    gen = job.state.generation
    d = job.feed(WorkerLost(3, 0, "a3.0", "stream_closed"), dt=1)
    assert d.state.phase == Phase.HOLDING
    (hold,) = of(d, HoldTrainer)
    assert hold == HoldTrainer(gen + 1, False, frozenset({3}), hold.reason)
    assert d.state.retries_used == 1
    d = job.ack_hold(d, step=12)
    assert d.state.phase == Phase.RUNNING
    (resume,) = of(d, ResumeTrainer)
    assert resume.generation == gen + 1
    assert resume.active == frozenset({0, 1, 2})
    assert resume.source == ResumeSource.MEMORY


def test_all_slices_required_holds_with_flush_and_waits_for_the_replacement():
    job = Job(Policy(num_slices=3, elastic_min_slice_count=-1))
    job.start()
    d = job.feed(WorkerLost(1, 0, "a1.0", "heartbeat_timeout"), dt=1)
    (hold,) = of(d, HoldTrainer)
    assert hold.flush and hold.down_slices == frozenset({1})
    d = job.ack_hold(d, step=12, committed=12)
    assert d.state.phase == Phase.WAITING and d.actions == ()
    assert d.state.trainer.committed_step == 12
    assert job.feed(Tick(), dt=5).state.phase == Phase.WAITING
    d = job.feed(WorkerJoined(1, 0, "b1.0"), dt=1)
    assert d.state.phase == Phase.RUNNING
    (resume,) = of(d, ResumeTrainer)
    assert resume.generation == hold.generation
    assert resume.active == frozenset({0, 1, 2})


def test_grow_back_when_a_replacement_registers_uses_no_retry():
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2))
    job.start()
    job.ack_resume(job.ack_hold(job.feed(WorkerLost(2, 0, "a2.0", "stream_closed"), dt=1)))
    assert job.state.active == frozenset({0, 1}) and job.state.retries_used == 1
    d = job.feed(WorkerJoined(2, 0, "b2.0"), dt=1)
    assert d.state.phase == Phase.HOLDING
    (hold,) = of(d, HoldTrainer)
    assert not hold.flush and hold.down_slices == frozenset()
    assert d.state.retries_used == 1
    d = job.ack_hold(d)
    assert of(d, ResumeTrainer)[0].active == frozenset({0, 1, 2})
    assert d.state.retries_used == 1


def test_trainer_slice_error_before_the_worker_loss_triggers_the_same_hold():
    job = Job(Policy(num_slices=4, elastic_min_slice_count=2))
    job.start()
    gen = job.state.generation
    d = job.feed(TrainerSliceError(frozenset({2}), "DATA_LOSS: slice 2 unreachable", 11, gen), dt=1)
    assert d.state.phase == Phase.HOLDING
    (hold,) = of(d, HoldTrainer)
    assert hold.generation == gen + 1 and hold.down_slices == frozenset({2}) and not hold.flush
    d2 = job.feed(WorkerLost(2, 0, "a2.0", "stream_closed"), dt=0.1)
    assert d2.actions == () and d2.state.generation == gen + 1 and d2.state.retries_used == 1
    d = job.ack_hold(d)
    assert of(d, ResumeTrainer)[0].active == frozenset({0, 1, 3})


def test_resume_uses_memory_only_while_a_replica_stayed_up():
    job = Job(Policy(num_slices=2))
    job.start()
    job.ack_hold(job.feed(WorkerLost(1, 0, "a1.0", "stream_closed"), dt=1))
    job.feed(WorkerLost(0, 0, "a0.0", "stream_closed"), dt=1)  # the last replica goes too
    job.feed(WorkerJoined(0, 0, "b0.0"), dt=1)
    d = job.feed(WorkerJoined(1, 0, "b1.0"), dt=1)
    assert of(d, ResumeTrainer)[0].source == ResumeSource.CHECKPOINT


def test_a_restarted_trainer_resumes_from_the_checkpoint():
    job = Job(Policy(num_slices=2))
    job.start()
    d = job.feed(TrainerAttached(0, -1), dt=1)  # a fresh process: re-synchronise
    assert d.state.phase == Phase.HOLDING and d.state.retries_used == 0
    assert of(job.ack_hold(d), ResumeTrainer)[0].source == ResumeSource.CHECKPOINT


def test_slice_error_is_cleared_only_by_a_replacement_host():
    job = Job(Policy(num_slices=2))
    job.start()
    job.ack_hold(job.feed(TrainerSliceError(frozenset({1}), "lost", 11, job.state.generation), dt=1))
    assert job.state.phase == Phase.WAITING
    assert job.feed(WorkerJoined(1, 0, "a1.0"), dt=1).state.phase == Phase.WAITING  # same process reconnects
    assert job.feed(WorkerJoined(1, 0, "b1.0"), dt=1).state.phase == Phase.RUNNING


def test_a_resume_the_trainer_never_got_is_repeated_when_it_attaches():
    job = Job(Policy(num_slices=2))
    job.start()
    job.ack_hold(job.feed(WorkerLost(1, 0, "a1.0", "stream_closed"), dt=1))
    job.feed(TrainerDetached(), dt=1)
    d = job.feed(WorkerJoined(1, 0, "b1.0"), dt=1)
    (lost,) = of(d, ResumeTrainer)  # no trainer attached: the executor cannot deliver it
    # The trainer, still held at that generation on its old mesh, comes back.
    d = job.feed(TrainerAttached(lost.generation, 10, frozenset({0, 1})), dt=1)
    (again,) = of(d, ResumeTrainer)
    assert (again.generation, again.active) == (lost.generation, lost.active)
    assert d.state.generation == lost.generation and d.state.phase == Phase.RUNNING
    job.ack_resume(d)
    job.feed(TrainerDetached(), dt=1)
    assert job.feed(TrainerAttached(lost.generation, 12, frozenset({0, 1})), dt=1).actions == ()


# --------------------------------------------------------------------------
# stale inputs
# --------------------------------------------------------------------------


def test_stale_acks_are_ignored():
    job = Job(Policy(num_slices=3, elastic_min_slice_count=-1))
    job.start()
    d = job.feed(WorkerLost(0, 0, "a0.0", "stream_closed"), dt=1)
    (hold,) = of(d, HoldTrainer)
    before = job.state
    d = job.feed(TrainerHeld(hold.generation - 1, 10, -1))
    assert d.state == before and d.actions == () and "stale" in d.reason
    d = job.feed(TrainerResumed(hold.generation - 1, 10, frozenset({0, 1, 2}), "memory"))
    assert d.state == before and d.actions == () and "stale" in d.reason
    assert job.feed(TrainerHeld(hold.generation, 10, -1)).state.phase == Phase.WAITING


def test_stale_worker_lost_of_an_old_incarnation_is_ignored():
    job = Job(Policy(num_slices=2))
    job.start()
    job.feed(WorkerJoined(1, 0, "new"), dt=1)  # the host restarted; still up
    before = job.state
    d = job.feed(WorkerLost(1, 0, "a1.0", "stream_closed"), dt=1)
    assert d.state == before and d.actions == () and "stale" in d.reason
    assert job.feed(WorkerLost(1, 0, "new", "stream_closed")).state.phase == Phase.HOLDING


def test_a_fresh_coordinator_starts_above_a_held_trainers_generation():
    job = Job(Policy(num_slices=2))  # restarted without its state file; the trainer lives on, held
    job.join_all()
    d = job.feed(TrainerAttached(7, 120, frozenset({0, 1}), held=True))
    (resume,) = of(d, ResumeTrainer)
    assert resume.generation == 8 and resume.source == ResumeSource.MEMORY


def test_a_blind_coordinator_waits_with_a_held_trainer_not_for_a_whole_start():
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, elastic_timeout_seconds=30, rejoin_grace_seconds=5))
    job.feed(WorkerJoined(0, 0, "a0.0"))
    d = job.feed(TrainerAttached(7, 120, frozenset({0, 1, 2}), held=True))
    assert d.state.phase == Phase.WAITING and d.actions == () and d.state.generation == 8
    job.feed(WorkerJoined(1, 0, "a1.0"), dt=1)
    d = job.feed(Tick(), dt=5)  # grace over, slice 2 never came back: go on with 2 of 3
    (resume,) = of(d, ResumeTrainer)
    assert resume.generation == 8 and resume.active == frozenset({0, 1}) and resume.source == ResumeSource.MEMORY


def test_a_blind_coordinator_adopts_a_training_trainer_without_stopping_it():
    job = Job(Policy(num_slices=2))  # restarted without its state file; the trainer keeps training
    job.feed(WorkerJoined(0, 0, "a0.0"))
    d = job.feed(TrainerAttached(7, 120, frozenset({0, 1}), committed_step=100))
    assert d.actions == () and d.state.phase == Phase.RUNNING and d.state.generation == 7
    assert d.state.expected_rejoin == {(1, 0)} and d.state.trainer.committed_step == 100
    assert job.feed(Tick(), dt=1).actions == ()  # host 1.0 still has its rejoin grace
    assert job.feed(WorkerJoined(1, 0, "a1.0"), dt=1).actions == ()
    assert job.feed(Tick(), dt=30).state.phase == Phase.RUNNING


def test_a_trainer_ahead_of_a_running_coordinator_is_re_synchronised():
    job = Job(Policy(num_slices=2))
    job.start()
    # The trainer carries out a hold an earlier coordinator process sent it.
    d = job.feed(TrainerHeld(7, 120, 100), dt=1)
    (hold,) = of(d, HoldTrainer)
    assert hold.generation == 8 and d.state.phase == Phase.HOLDING and d.state.retries_used == 0
    assert of(job.ack_hold(d), ResumeTrainer)[0].generation == 8


def test_health_report_of_an_old_incarnation_is_ignored():
    job = Job(Policy(num_slices=2))
    job.start()
    before = job.state
    assert job.feed(WorkerHealth(0, 0, "old", False)).state == before
    assert job.feed(WorkerHealth(0, 0, "a0.0", False, "pathways worker down")).state.phase == Phase.HOLDING


# --------------------------------------------------------------------------
# terminal outcomes
# --------------------------------------------------------------------------


def test_waiting_deadline_passing_fails_with_exit_code_42():
    job = Job(Policy(num_slices=2, elastic_timeout_seconds=60))
    job.start()
    job.ack_hold(job.feed(WorkerLost(1, 0, "a1.0", "stream_closed"), dt=1))
    assert job.state.phase == Phase.WAITING
    assert job.feed(Tick(), dt=59).state.phase == Phase.WAITING
    d = job.feed(Tick(), dt=1)
    assert d.state.phase == Phase.FAILED and d.state.exit_code == 42
    (abort,) = of(d, AbortTrainer)
    assert abort.exit_code == 42 == EXIT_RESTART
    assert of(d, ExitCoordinator) == [ExitCoordinator(42, abort.reason)]


def test_hold_not_acknowledged_in_time_fails():
    job = Job(Policy(num_slices=2, elastic_timeout_seconds=60))
    job.start()
    job.feed(WorkerLost(1, 0, "a1.0", "stream_closed"), dt=1)
    # The hold flushes (no slice to go on with), and a flush has its own timeout.
    assert job.feed(Tick(), dt=60).state.phase == Phase.HOLDING
    d = job.feed(Tick(), dt=600)
    assert d.state.phase == Phase.FAILED and of(d, ExitCoordinator)[0].exit_code == 42
    assert "660 s" in d.reason


def test_a_hold_without_flush_must_be_acknowledged_within_elastic_timeout():
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, elastic_timeout_seconds=60))
    job.start()
    d = job.feed(WorkerLost(1, 0, "a1.0", "stream_closed"), dt=1)
    assert not of(d, HoldTrainer)[0].flush
    assert job.feed(Tick(), dt=60).state.phase == Phase.FAILED


@pytest.mark.parametrize("max_retries", [1, 2, 3, 10])
def test_elastic_max_retries_recoveries_are_allowed_and_the_next_failure_is_terminal(max_retries):
    # The flag read by its name (README.md, --help, agent/core/model.py Policy): N recoveries.
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, elastic_max_retries=max_retries))
    job.start()
    for n in range(max_retries):  # the allowed recoveries, each followed by a grow back
        d = job.feed(WorkerLost(2, 0, f"{'ab'[n % 2]}2.0", "stream_closed"), dt=1)
        assert d.state.phase == Phase.HOLDING and d.state.retries_used == n + 1
        job.ack_resume(job.ack_hold(d))
        job.ack_resume(job.ack_hold(job.feed(WorkerJoined(2, 0, f"{'ba'[n % 2]}2.0"), dt=1)))
        assert job.state.active == frozenset({0, 1, 2})
    inc = job.state.hosts[(2, 0)].incarnation
    d = job.feed(WorkerLost(2, 0, inc, "stream_closed"), dt=1)
    assert d.state.phase == Phase.FAILED
    assert "elastic_max_retries" in d.reason
    assert of(d, AbortTrainer)[0].exit_code == 42


def test_trainer_finished_completes_and_exits_zero():
    job = Job(Policy(num_slices=2))
    job.start()
    d = job.feed(TrainerFinished(100), dt=1)
    assert d.state.phase == Phase.COMPLETED and d.state.exit_code == 0
    assert of(d, ExitCoordinator) == [ExitCoordinator(0, "training finished")]
    d = job.feed(WorkerLost(0, 0, "a0.0", "shutdown"))
    assert d.state.phase == Phase.COMPLETED and d.actions == ()


def test_terminal_phase_ignores_trainer_events():
    job = Job(Policy(num_slices=2))
    job.start()
    job.feed(TrainerFinished(100))
    for ev in (TrainerAttached(9, 5), TrainerHeld(1, 1, 1), Tick(), TrainerFinished(101)):
        d = job.feed(ev, dt=1000)
        assert d.state == job.decisions[-2].state and d.actions == ()


# --------------------------------------------------------------------------
# trainer settings and policy
# --------------------------------------------------------------------------


def test_trainer_settings_on_attach_are_adopted():
    job = Job(Policy(num_slices=4))
    d = job.feed(TrainerAttached(0, -1, settings=TrainerSettings(2, 90.0, 5)))
    p = d.state.policy
    assert (p.elastic_min_slice_count, p.elastic_timeout_seconds, p.elastic_max_retries) == (2, 90.0, 5)
    assert "adopted" in d.reason and "elastic_min_slice_count=2" in d.reason


def test_invalid_trainer_settings_are_kept_out_with_a_reason():
    policy = Policy(num_slices=4, elastic_min_slice_count=3)
    job = Job(policy)
    d = job.feed(TrainerAttached(0, -1, settings=TrainerSettings(7, 90.0, 5)))
    assert d.state.policy == policy
    assert "invalid" in d.reason and "7" in d.reason
    assert d.state.trainer.attached


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"num_slices": 0}, "num_slices must be >= 1, got 0"),
        ({"num_slices": 2, "hosts_per_slice": 0}, "hosts_per_slice must be >= 1, got 0"),
        ({"num_slices": 2, "elastic_min_slice_count": 3}, "got 3"),
        ({"num_slices": 2, "elastic_min_slice_count": 0}, "got 0"),
        ({"num_slices": 2, "elastic_min_slice_count": -2}, "got -2"),
        ({"num_slices": 2, "elastic_timeout_seconds": 0}, "elastic_timeout_seconds must be > 0, got 0"),
        ({"num_slices": 2, "elastic_max_retries": 0}, "elastic_max_retries must be >= 1, got 0"),
    ],
)
def test_policy_validation_names_the_bad_value(kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        Policy(**kwargs)


def test_min_slices_of_minus_one_is_every_slice():
    assert Policy(num_slices=5).min_slices == 5
    assert Policy(num_slices=5, elastic_min_slice_count=2).min_slices == 2


# --------------------------------------------------------------------------
# purity and reasons
# --------------------------------------------------------------------------


def _every_event(state: State) -> list:
    g = state.generation
    return [
        WorkerJoined(0, 0, "fresh"),
        WorkerJoined(0, 0, "a0.0"),
        WorkerJoined(9, 0, "out-of-range"),
        WorkerLost(0, 0, "a0.0", "stream_closed"),
        WorkerLost(1, 0, "stale", "stream_closed"),
        WorkerHealth(1, 0, "a1.0", False, "unhealthy"),
        WorkerHealth(1, 0, "a1.0", True),
        TrainerAttached(g, 5, frozenset({0, 1}), TrainerSettings(1, 30.0, 3)),
        TrainerAttached(g + 3, -1, frozenset(), TrainerSettings(0, 30.0, 3)),
        TrainerDetached(),
        TrainerStepped(20, g),
        TrainerSliceError(frozenset({1}), "lost", 20, g),
        TrainerSliceError(frozenset(), "unknown", 20, g),
        TrainerHeld(g, 20, 18),
        TrainerHeld(g - 1, 20, 18),
        TrainerResumed(g, 20, frozenset({0, 1}), "memory"),
        TrainerFlushed(g, 20),
        TrainerFinished(20),
        Tick(),
    ]


def _states_in_every_phase() -> list[State]:
    out = []
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, elastic_timeout_seconds=60))
    out.append(job.state)  # STARTING
    job.start()
    out.append(job.state)  # RUNNING
    d = job.feed(WorkerLost(2, 0, "a2.0", "stream_closed"), dt=1)
    out.append(d.state)  # HOLDING
    job.feed(WorkerLost(1, 0, "a1.0", "stream_closed"), dt=1)
    job.ack_hold(job.decisions[-1])
    out.append(job.state)  # WAITING
    out.append(job.feed(Tick(), dt=100).state)  # FAILED
    out.append(dataclasses.replace(out[1], phase=Phase.COMPLETED, exit_code=0))
    return out


def _snapshot(state: State) -> dict:
    return {
        f.name: dict(v) if isinstance(v := getattr(state, f.name), type(_frozen())) else v
        for f in dataclasses.fields(state)
    }


@pytest.mark.parametrize("phase", list(Phase), ids=str)
def test_every_event_in_every_phase_gives_a_reason_and_never_mutates_the_input(phase):
    (state,) = [s for s in _states_in_every_phase() if s.phase == phase]
    for event in _every_event(state):
        for now in (0.0, 1e6):
            snap = _snapshot(state)
            d = decide(state, event, now)
            assert _snapshot(state) == snap
            assert isinstance(d.reason, str) and d.reason.strip(), (state.phase, event)
            assert decide(state, event, now) == d


def test_decide_does_not_share_mutable_host_maps_with_its_input():
    state = dataclasses.replace(initial_state(Policy(num_slices=2), 0.0), hosts=_frozen({(0, 0): HostRecord("a")}))
    d = decide(state, WorkerJoined(1, 0, "b"), 1.0)
    assert dict(state.hosts) == {(0, 0): HostRecord("a")}
    assert set(d.state.hosts) == {(0, 0), (1, 0)}
    d = decide(state, WorkerLost(0, 0, "a", "shutdown"), 1.0)
    assert (0, 0) in state.hosts and (0, 0) not in d.state.hosts


def test_a_trainer_held_at_the_generation_a_blind_coordinator_adopted_is_resumed():
    # The previous coordinator sent hold 2 and died; the new one, started blind, learnt
    # generation 2 from the workers and adopted the trainer (still running generation 1)
    # before it reached the step boundary. Its ack for 2 must not leave it held for ever.
    job = Job(Policy(num_slices=2, elastic_min_slice_count=1))
    job.feed(WorkerJoined(0, 0, "a0.0", generation_seen=2))
    job.feed(WorkerJoined(1, 0, "a1.0", generation_seen=2))
    d = job.feed(TrainerAttached(1, 6, frozenset({0, 1})))
    assert d.state.phase == Phase.RUNNING and d.state.generation == 2
    d = job.feed(TrainerHeld(2, 7, 5), dt=1)
    (hold,) = of(d, HoldTrainer)
    assert hold.generation == 3 and not hold.flush and d.state.retries_used == 0
    (resume,) = of(job.ack_hold(d), ResumeTrainer)
    assert resume.generation == 3 and resume.active == frozenset({0, 1})


def test_slices_still_in_their_rejoin_grace_keep_their_replicas():
    # A blind coordinator adopts a training trainer before any worker re-registered, then
    # re-synchronises it with a hold. The resume must not throw away the trainer's memory
    # just because the hosts had not reconnected yet when the hold was acknowledged.
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, rejoin_grace_seconds=10))
    job.feed(TrainerAttached(1, 6, frozenset({0, 1, 2})))
    d = job.feed(TrainerHeld(2, 7, -1), dt=0.1)
    d = job.ack_hold(d, step=7)
    assert d.actions == () and d.state.phase == Phase.WAITING
    for sl in range(3):
        d = job.feed(WorkerJoined(sl, 0, f"a{sl}.0"), dt=0.5)
    (resume,) = of(d, ResumeTrainer)
    assert resume.source == ResumeSource.MEMORY and resume.active == frozenset({0, 1, 2})


def test_a_resume_on_slices_not_decided_is_checked_and_re_held():
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2))
    job.start()
    d = job.feed(OperatorCommand("drain", "maintenance", slice=2), dt=1)
    (resume,) = of(job.ack_hold(d), ResumeTrainer)
    assert resume.active == frozenset({0, 1})
    # The trainer's own runtime built its mesh over the drained (healthy) slice too.
    d = job.feed(TrainerResumed(resume.generation, 10, frozenset({0, 1, 2}), "memory"), dt=0.5)
    (hold,) = of(d, HoldTrainer)
    assert "mesh mismatch" in d.reason and d.state.retries_used == 0 and hold.generation == resume.generation + 1
    assert of(job.ack_hold(d), ResumeTrainer)[0].active == frozenset({0, 1})


def test_a_resume_on_fewer_slices_than_decided_is_reported():
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2))
    job.start()
    d = job.feed(TrainerResumed(job.state.generation, 10, frozenset({0, 1}), "memory"), dt=0.5)
    assert d.actions == () and "mesh mismatch: decided slice(s) [2] not in the trainer's mesh" in d.reason


def test_a_blind_coordinator_waiting_with_a_held_trainer_ends_the_wait_at_its_timeout():
    # Restarted without its state file after the job had already waited: a slice that never
    # comes back must not keep the trainer held for the whole rejoin grace on top.
    job = Job(Policy(num_slices=2, elastic_timeout_seconds=4, rejoin_grace_seconds=10))
    job.feed(WorkerJoined(0, 0, "a0.0"))
    d = job.feed(TrainerAttached(2, 9, frozenset({0, 1}), committed_step=9, held=True))
    assert d.state.phase == Phase.WAITING and d.state.expected_rejoin == {(1, 0)}
    assert job.feed(Tick(), dt=3.9).state.phase == Phase.WAITING
    d = job.feed(Tick(), dt=0.2)
    assert d.state.phase == Phase.FAILED and of(d, AbortTrainer)[0].exit_code == 42


def test_a_hold_during_the_rejoin_grace_does_not_name_slices_still_rejoining_as_down():
    # Blind restart: the trainer is adopted before any worker re-registered, then re-synchronised.
    job = Job(Policy(num_slices=3, elastic_min_slice_count=2, rejoin_grace_seconds=10))
    job.feed(TrainerAttached(1, 6, frozenset({0, 1, 2})))
    d = job.feed(TrainerHeld(2, 7, -1), dt=0.1)
    (hold,) = of(d, HoldTrainer)
    assert hold.down_slices == frozenset(), hold
