"""The decision core for a multi-controller job (``Policy.trainer_processes`` > 1): it never shrinks."""

from __future__ import annotations

from agent.constants import EXIT_RESTART
from agent.core.decide import MC_NOTICE_EXIT_MARGIN
from agent.core.model import (
    AbortTrainer,
    ExitCoordinator,
    HoldTrainer,
    NodeNotice,
    OperatorCommand,
    Phase,
    ResumeTrainer,
    Tick,
    TrainerHeld,
    TrainerResumed,
    TrainerSliceError,
    TrainerStepped,
    WorkerLost,
)
from tests.core.driver import Job, Policy, of


def mc_job(**kw) -> Job:
    kw.setdefault("num_slices", 2)
    kw.setdefault("hosts_per_slice", 2)
    kw.setdefault("trainer_processes", 4)
    j = Job(Policy(**kw))
    j.start()
    j.feed(TrainerStepped(10, j.state.generation, 0.05), dt=0.5)
    return j


def test_min_slices_is_every_slice_whatever_the_elastic_setting() -> None:
    assert Policy(num_slices=4, elastic_min_slice_count=2, trainer_processes=8).min_slices == 4
    assert Policy(num_slices=4, elastic_min_slice_count=2).min_slices == 2


def test_a_host_killed_aborts_at_once_with_42_and_spends_no_retry() -> None:
    j = mc_job()
    d = j.feed(WorkerLost(1, 0, "a1.0", "stream_closed"), dt=1.0)
    (abort,) = of(d, AbortTrainer)
    assert abort.exit_code == EXIT_RESTART
    assert of(d, ExitCoordinator)[0].exit_code == EXIT_RESTART
    assert not of(d, HoldTrainer)
    assert j.state.phase == Phase.FAILED and j.state.retries_used == 0
    assert "multi-controller" in d.reason


def test_the_same_loss_in_a_single_controller_job_holds_instead() -> None:
    j = mc_job(trainer_processes=1, elastic_min_slice_count=1)
    d = j.feed(WorkerLost(1, 0, "a1.0", "stream_closed"), dt=1.0)
    assert of(d, HoldTrainer) and not of(d, AbortTrainer)


def test_a_notice_holds_with_a_flush_then_aborts_once_every_process_held() -> None:
    j = mc_job()
    d = j.feed(NodeNotice("terminate", "metadata", slice=1, reason="maintenance"), dt=1.0)
    (hold,) = of(d, HoldTrainer)
    assert hold.flush and not of(d, AbortTrainer)
    d = j.feed(TrainerHeld(hold.generation, 14, 14, 0.3), dt=0.5)
    (abort,) = of(d, AbortTrainer)
    assert abort.exit_code == EXIT_RESTART
    assert "the held step 14 is committed" in d.reason and "NOT committed" not in d.reason


def test_a_flush_that_did_not_commit_is_named_in_the_abort() -> None:
    j = mc_job()
    (hold,) = of(j.feed(NodeNotice("terminate", "metadata", slice=0), dt=1.0), HoldTrainer)
    d = j.feed(TrainerHeld(hold.generation, 14, 10, 0.3, flush_error="process 2: disk full"), dt=0.5)
    assert of(d, AbortTrainer) and "NOT committed" in d.reason


def test_a_host_lost_while_the_announced_hold_is_pending_aborts_without_waiting() -> None:
    j = mc_job()
    of(j.feed(NodeNotice("terminate", "metadata", slice=1), dt=1.0), HoldTrainer)
    d = j.feed(WorkerLost(0, 1, "a0.1", "heartbeat_timeout"), dt=0.5)
    assert of(d, AbortTrainer) and j.state.phase == Phase.FAILED


def test_processes_held_at_different_steps_never_resume() -> None:
    j = mc_job()
    (hold,) = of(j.feed(OperatorCommand("hold", "look"), dt=1.0), HoldTrainer)
    d = j.feed(TrainerHeld(hold.generation, 12, 12, disagreement="process 0 at step 12, process 1 at step 13"))
    assert of(d, AbortTrainer) and not of(d, ResumeTrainer)
    assert "different steps" in d.reason


def test_an_operator_hold_with_every_slice_up_resumes_from_memory() -> None:
    j = mc_job()
    (hold,) = of(j.feed(OperatorCommand("hold", "look"), dt=1.0), HoldTrainer)
    j.feed(TrainerHeld(hold.generation, 12, 12))
    d = j.feed(OperatorCommand("resume", "done"), dt=1.0)
    (resume,) = of(d, ResumeTrainer)
    assert str(resume.source) == "memory" and not of(d, AbortTrainer)
    j.feed(TrainerResumed(resume.generation, 12, resume.active, "memory"))
    assert j.state.phase == Phase.RUNNING


def test_a_slice_error_or_a_hang_aborts() -> None:
    j = mc_job()
    d = j.feed(TrainerSliceError(frozenset({1}), "DATA_LOSS", 11, j.state.generation), dt=0.5)
    assert of(d, AbortTrainer)
    j = mc_job(hang_min_seconds=5.0)
    d = j.feed(Tick(), dt=30.0)
    assert of(d, AbortTrainer) and "hang" in d.reason


def test_operator_checkpoint_is_refused_outside_a_hold() -> None:
    j = mc_job()
    d = j.feed(OperatorCommand("checkpoint", "now"))
    assert d.rejected and "agreed step" in d.rejected


def _held_on_a_notice_due_in(j: Job, seconds: float, *, committed: int = 14):
    """A maintenance window for slice 1 starting ``seconds`` from now (within the notice lead, so it
    drains at once); every process held at step 14."""
    starts = j.now + 1.0 + seconds
    notice = NodeNotice("scheduled", "pubsub", slice=1, deadline=starts, starts_at=starts, reason="window")
    (hold,) = of(j.feed(notice, dt=1.0), HoldTrainer)
    assert hold.flush
    return j.feed(TrainerHeld(hold.generation, 14, committed, 0.3), dt=0.5)


def test_a_held_job_waits_for_a_notice_that_may_still_be_cancelled_and_resumes_when_it_is() -> None:
    j = mc_job(elastic_timeout_seconds=300.0)
    d = _held_on_a_notice_due_in(j, 60.0)
    assert not of(d, AbortTrainer) and j.state.phase == Phase.WAITING
    assert "waiting" in d.reason and "cancelled" in d.reason
    assert not of(j.feed(Tick(), dt=20.0), AbortTrainer)
    d = j.feed(NodeNotice("cancelled", "pubsub", slice=1, cleared=True, reason="CANCELLED"), dt=1.0)
    (resume,) = of(d, ResumeTrainer)
    assert resume.active == frozenset({0, 1}) and str(resume.source) == "memory"
    assert not of(d, AbortTrainer) and j.state.retries_used == 0


def test_the_wait_ends_with_42_when_the_notice_deadline_passes() -> None:
    j = mc_job(elastic_timeout_seconds=300.0)
    _held_on_a_notice_due_in(j, 30.0)
    assert not of(j.feed(Tick(), dt=20.0), AbortTrainer)
    # Every process leaves with 42 a margin before the node goes, not with it.
    d = j.feed(Tick(), dt=30.0 - 0.5 - 20.0 - MC_NOTICE_EXIT_MARGIN + 0.1)
    (abort,) = of(d, AbortTrainer)
    assert abort.exit_code == EXIT_RESTART and "the held step 14 is committed" in d.reason


def test_the_wait_never_outlasts_the_elastic_timeout() -> None:
    j = mc_job(elastic_timeout_seconds=20.0, notice_lead_seconds=900.0)
    _held_on_a_notice_due_in(j, 600.0)
    assert not of(j.feed(Tick(), dt=15.0), AbortTrainer)
    assert of(j.feed(Tick(), dt=10.0), AbortTrainer)


def test_the_wait_ends_at_once_when_a_drained_host_goes() -> None:
    j = mc_job(elastic_timeout_seconds=300.0)
    _held_on_a_notice_due_in(j, 60.0)
    d = j.feed(WorkerLost(1, 0, "a1.0", "stream_closed"), dt=2.0)
    assert of(d, AbortTrainer) and j.state.phase == Phase.FAILED


def test_no_wait_without_a_committed_flush() -> None:
    j = mc_job(elastic_timeout_seconds=300.0)
    d = _held_on_a_notice_due_in(j, 60.0, committed=10)
    assert of(d, AbortTrainer) and "NOT committed" in d.reason


def test_no_wait_for_an_imminent_notice_whose_deadline_is_only_our_estimate() -> None:
    # The metadata server's maintenance-event names no time: its deadline is --maintenance-notice-seconds.
    j = mc_job(elastic_timeout_seconds=300.0)
    notice = NodeNotice("maintenance-event", "metadata", slice=1, deadline=j.now + 61.0)
    (hold,) = of(j.feed(notice, dt=1.0), HoldTrainer)
    assert of(j.feed(TrainerHeld(hold.generation, 14, 14, 0.3), dt=0.5), AbortTrainer)
