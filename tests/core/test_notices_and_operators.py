"""Proactive drains from notices, and operator commands, in the decision core."""

from __future__ import annotations

from dataclasses import replace

from agent.core.decide import NOTICE_STALE_SECONDS
from agent.core.model import (
    AbortTrainer,
    ExitCoordinator,
    FlushTrainer,
    HoldTrainer,
    OperatorCommand,
    Phase,
    PrepareTrainer,
    ResumeTrainer,
    Tick,
    TrainerHeld,
    WorkerHealth,
    WorkerJoined,
    WorkerLost,
)
from tests.core.driver import Job as _Job
from tests.core.driver import Policy, kinds, one


class Job(_Job):
    """A running job of ``n`` one-host slices, nodes named node-S, pools pool-S/2; 0.1 s per event."""

    def __init__(self, n: int = 4, min_slices: int = 2, retries: int = 10) -> None:
        super().__init__(Policy(num_slices=n, elastic_min_slice_count=min_slices, elastic_max_retries=retries), dt=0.1)
        self.join_all(nodes=True)
        self.attach_and_start("fresh")


def test_notice_drains_the_slice_from_memory_and_no_retry() -> None:
    job = Job(min_slices=2)
    d = job.notice(node="node-1")
    hold = one(d, HoldTrainer)
    assert hold.snapshot and not hold.flush and 1 in hold.down_slices
    assert job.state.retries_used == 0 and job.state.phase == Phase.HOLDING
    d = job.feed(TrainerHeld(hold.generation, 40, 40))
    resume = one(d, ResumeTrainer)
    assert resume.active == frozenset({0, 2, 3}) and str(resume.source) == "memory"


def test_notice_with_all_slices_required_waits_for_the_replacement() -> None:
    job = Job(min_slices=-1)
    hold = one(job.notice(node="node-2"), HoldTrainer)
    d = job.feed(TrainerHeld(hold.generation, 10, 10))
    assert d.actions == () and job.state.phase == Phase.WAITING
    d = job.feed(WorkerJoined(2, 0, "b2", node="node-2-new"))
    assert one(d, ResumeTrainer).active == frozenset(range(4))


def test_notice_past_its_deadline_while_the_node_is_up_is_a_drain_not_a_failure() -> None:
    job = Job()
    d = job.notice(node="node-1", deadline=job.now - 1.0)
    hold = one(d, HoldTrainer)
    assert hold.snapshot and 1 in hold.down_slices
    assert job.state.retries_used == 0 and job.state.slice_errors == {}


def test_notice_after_its_window_began_is_a_drain_now() -> None:
    job = Job()
    d = job.notice(node="node-2", starts_at=job.now - 30.0)
    hold = one(d, HoldTrainer)
    assert hold.snapshot and hold.down_slices == frozenset({2})
    assert job.state.retries_used == 0 and "began 30 s ago" in d.reason


def scheduled_job(lead: float = 120.0) -> Job:
    job = Job(min_slices=2)
    job.state = replace(job.state, policy=replace(job.state.policy, notice_lead_seconds=lead))
    return job


def test_scheduled_window_drains_at_its_start_minus_the_lead_time() -> None:
    job = scheduled_job(lead=120.0)
    start = job.now + 1000.0
    d = job.notice(node="node-1", starts_at=start, event_time=10.0)
    # Only advice for now: the mesh the job will run on next, so its program is built during the lead.
    assert kinds(d) == [PrepareTrainer] and job.state.phase == Phase.RUNNING
    assert one(d, PrepareTrainer).active == frozenset({0, 2, 3})
    assert job.state.planned[1].since == start - 120.0 and 1 not in job.state.drains
    assert "draining slice(s) [1] in 880 s" in d.reason
    d = job.feed(Tick(), dt=start - 120.0 - job.now - 0.5)  # not yet
    assert d.actions == () and 1 in job.state.planned
    d = job.feed(Tick(), dt=1.0)  # now: the drain begins before the window
    hold = one(d, HoldTrainer)
    assert hold.snapshot and hold.down_slices == frozenset({1}) and job.now < start
    assert job.state.retries_used == 0 and 1 not in job.state.planned and 1 in job.state.drains


def test_a_moved_window_moves_the_planned_drain() -> None:
    job = scheduled_job(lead=100.0)
    job.notice(node="node-3", starts_at=job.now + 500.0, event_time=1.0)
    first = job.state.planned[3].since
    d = job.notice(node="node-3", starts_at=job.now + 5000.0, event_time=2.0)
    assert d.actions == () and job.state.planned[3].since > first + 4000
    d = job.feed(Tick(), dt=first - job.now + 1.0)  # the old time passes: nothing
    assert d.actions == () and job.state.phase == Phase.RUNNING


def test_the_same_schedule_twice_is_a_duplicate() -> None:
    job = scheduled_job()
    start = job.now + 900.0
    job.notice(node="node-1", starts_at=start, event_time=1.0)
    assert job.notice(node="node-1", starts_at=start, event_time=1.0).outcome == "duplicate"


def test_a_cancelled_window_lifts_the_plan() -> None:
    job = scheduled_job()
    job.notice(node="node-1", starts_at=job.now + 900.0, event_time=1.0)
    d = job.notice(node="node-1", cleared=True, event_time=2.0)
    assert d.actions == () and job.state.planned == {} and "cancelled" in d.reason
    assert job.feed(Tick(), dt=2000.0).actions == ()


def test_a_window_moved_after_its_drain_began_lifts_the_drain_until_the_new_time() -> None:
    job = scheduled_job(lead=100.0)
    job.notice(node="node-1", starts_at=job.now + 150.0, event_time=1.0)
    hold = one(job.feed(Tick(), dt=60.0), HoldTrainer)
    job.feed(TrainerHeld(hold.generation, 9, 9))
    assert 1 not in job.state.active
    d = job.notice(node="node-1", starts_at=job.now + 86400.0, event_time=2.0)
    assert 1 not in job.state.drains and 1 in job.state.planned
    assert one(d, HoldTrainer).flush is False  # growing back onto the slice


def test_a_completed_window_clears_the_drain() -> None:
    job = scheduled_job(lead=100.0)
    job.notice(node="node-2", starts_at=job.now + 101.0, event_time=1.0)
    hold = one(job.feed(Tick(), dt=2.0), HoldTrainer)
    job.feed(TrainerHeld(hold.generation, 3, 3))
    d = job.notice(node="node-2", cleared=True, event_time=3.0)
    assert 2 not in job.state.drains and "lifted" in d.reason
    assert job.state.retries_used == 0


def test_a_notice_never_adds_slice_errors() -> None:
    job = Job()
    for i, kw in enumerate(
        [{"deadline": job.now - 100}, {"starts_at": job.now - 5}, {"deadline": None}, {"starts_at": job.now + 9}]
    ):
        job.notice(node=f"node-{i}", event_time=float(i), **kw)
    assert job.state.slice_errors == {} and job.state.retries_used == 0


def test_cleared_notice_lifts_the_drain_and_grows_back() -> None:
    job = Job()
    hold = one(job.notice(node="node-3", event_time=100.0), HoldTrainer)
    job.feed(TrainerHeld(hold.generation, 5, 5))
    assert 3 not in job.state.active
    d = job.notice(node="node-3", cleared=True, event_time=101.0)
    assert 3 not in job.state.drains
    assert one(d, HoldTrainer).flush is False  # growing back loses nothing, no flush needed


def test_foreign_duplicate_and_out_of_order_notices_are_set_aside() -> None:
    job = Job()
    assert job.notice(node="not-ours").outcome == "foreign"
    job.notice(node="node-1", event_time=200.0)
    assert job.notice(node="node-1", event_time=200.5).outcome == "duplicate"
    assert job.notice(node="node-1", cleared=True, event_time=150.0).outcome == "out_of_order"
    assert 1 in job.state.drains


def test_node_pool_upgrade_drains_every_slice_of_the_pool() -> None:
    job = Job(min_slices=1)
    d = job.notice(node_pool="pool-1")
    assert one(d, HoldTrainer).down_slices == frozenset({2, 3})


def test_operator_hold_stays_held_until_an_operator_resumes() -> None:
    job = Job()
    hold = one(job.feed(OperatorCommand("hold", "maintenance window")), HoldTrainer)
    assert hold.flush and job.state.operator_hold
    d = job.feed(TrainerHeld(hold.generation, 7, 7))
    assert d.actions == () and job.state.phase == Phase.WAITING
    d = job.feed(OperatorCommand("resume", "done"), dt=1000.0)  # no timeout while an operator holds
    assert one(d, ResumeTrainer).active == frozenset(range(4))


def test_an_operator_hold_during_a_failure_hold_tells_the_held_trainer_so() -> None:
    # Held for a lost slice and waiting for it: the trainer bounds that wait (no decision for
    # elastic_timeout_seconds and a grace ends it); an operator hold has no bound, so the trainer must hear of it.
    job = Job(min_slices=4)
    fail = one(job.feed(WorkerLost(1, 0, "a1", "stream_closed")), HoldTrainer)
    job.feed(TrainerHeld(fail.generation, 7, 7))
    assert job.state.phase == Phase.WAITING
    d = job.feed(OperatorCommand("hold", "investigating"))
    again = one(d, HoldTrainer)
    assert again.generation == fail.generation and not again.flush
    assert again.reason.startswith("operator hold") and again.down_slices == job.state.hold_down
    assert job.state.operator_hold and job.state.deadline is None
    # Its acknowledgement changes nothing; the operator's resume decides.
    assert job.feed(TrainerHeld(fail.generation, 7, 7)).actions == ()
    assert job.state.phase == Phase.WAITING and job.state.operator_hold


def test_operator_resume_while_running_is_refused() -> None:
    job = Job()
    before = job.state
    d = job.feed(OperatorCommand("resume", "why not"))
    assert d.rejected and "running" in d.rejected and job.state == before


def test_operator_drain_checkpoint_and_bad_slice() -> None:
    job = Job()
    assert one(job.feed(OperatorCommand("drain", "bad HBM", slice=1)), HoldTrainer).snapshot
    assert "slice 9" in job.feed(OperatorCommand("drain", "x", slice=9)).rejected
    flush = one(job.feed(OperatorCommand("checkpoint", "before upgrade")), FlushTrainer)
    assert flush.generation == job.state.generation


def test_operator_undrain_undoes_an_operator_drain_only() -> None:
    job = Job()
    assert "not drained" in job.feed(OperatorCommand("undrain", "x", slice=1)).rejected
    hold = one(job.feed(OperatorCommand("drain", "bad HBM", slice=1)), HoldTrainer)
    job.feed(TrainerHeld(hold.generation, 5, 5))
    assert 1 not in job.state.active and 1 in job.state.drains
    d = job.feed(OperatorCommand("undrain", "HBM replaced", slice=1))
    assert not d.rejected and 1 not in job.state.drains, d.reason
    assert one(d, HoldTrainer).flush is False  # grows back onto slice 1, as onto a returned slice
    assert "slice 9" in job.feed(OperatorCommand("undrain", "x", slice=9)).rejected
    # A notice's drain is the notice's to lift.
    job = Job()
    job.notice(node="node-3", event_time=100.0)
    assert 3 in job.state.drains
    d = job.feed(OperatorCommand("undrain", "x", slice=3))
    assert d.rejected and "notice" in d.rejected and 3 in job.state.drains


TWO_DAYS = 2 * 86400.0


def test_a_two_day_old_maintenance_notice_for_a_healthy_node_is_ignored_as_stale() -> None:
    job = Job()
    # A GCE upcomingMaintenance entry whose window (start and end) lies two days back, and an imminent one
    # whose stop was due two days ago: both for nodes whose hosts are registered and healthy.
    d = job.notice(node="node-1", starts_at=job.now - TWO_DAYS, ends_at=job.now - TWO_DAYS + 3600.0, event_time=1.0)
    assert d.outcome == "stale" and d.actions == (), d.reason
    assert "ignored" in d.reason and "node-1" in d.reason
    d = job.notice(node="node-2", deadline=job.now - TWO_DAYS, event_time=1.0)
    assert d.outcome == "stale" and d.actions == (), d.reason
    assert job.state.drains == {} and job.state.planned == {} and job.state.phase == Phase.RUNNING
    assert job.state.active == frozenset(range(4))


def test_a_notice_just_inside_the_bound_still_drains() -> None:
    job = Job()
    d = job.notice(node="node-1", ends_at=job.now - NOTICE_STALE_SECONDS + 5.0, deadline=job.now - 3000.0)
    assert not d.outcome and one(d, HoldTrainer).down_slices == frozenset({1}), d.reason
    # A window still to come is as it was: planned, then drained.
    job = scheduled_job()
    d = job.notice(node="node-2", starts_at=job.now + 900.0, ends_at=job.now + 4500.0, event_time=1.0)
    assert not d.outcome and 2 in job.state.planned


def test_a_stale_notice_for_an_unhealthy_node_still_drains() -> None:
    job = Job()
    job.feed(WorkerHealth(1, 0, "a1", False, "pathways worker down"))
    d = job.notice(node="node-1", deadline=job.now - TWO_DAYS, event_time=1.0)
    assert d.outcome != "stale" and 1 in job.state.drains, d.reason


def _drained_and_held(job: Job, node: str, s: int, end: float) -> None:
    hold = one(job.notice(node=node, deadline=end - 60.0, ends_at=end), HoldTrainer)
    job.feed(TrainerHeld(hold.generation, 7, 7))
    assert s in job.state.drains and s not in job.state.active


def test_a_notice_drain_of_a_healthy_node_lifts_after_its_window_and_the_grace() -> None:
    job = Job()
    end = job.now + 60.0
    _drained_and_held(job, "node-1", 1, end)
    d = job.feed(Tick(), dt=end + NOTICE_STALE_SECONDS - 1.0 - job.now)
    assert d.actions == () and 1 in job.state.drains
    d = job.feed(Tick(), dt=2.0)
    assert 1 not in job.state.drains and "lifted" in d.reason and "still up and healthy" in d.reason, d.reason
    hold = one(d, HoldTrainer)  # grows back onto slice 1: no flush, no retry
    assert hold.flush is False and job.state.retries_used == 0
    resume = one(job.feed(TrainerHeld(hold.generation, 8, 8)), ResumeTrainer)
    assert resume.active == frozenset(range(4))


def test_a_notice_drain_of_an_unhealthy_or_gone_node_is_not_lifted() -> None:
    job = Job()
    end = job.now + 60.0
    _drained_and_held(job, "node-1", 1, end)
    _drained_and_held(job, "node-2", 2, end)
    job.feed(WorkerHealth(1, 0, "a1", False, "pathways worker down"))
    job.feed(WorkerLost(2, 0, "a2", "stream_closed"))
    job.feed(Tick(), dt=end + 2 * NOTICE_STALE_SECONDS - job.now)
    assert {1, 2} <= set(job.state.drains) and job.state.active == frozenset({0, 3})


def test_an_operator_drain_is_never_lifted_by_time() -> None:
    job = Job()
    hold = one(job.feed(OperatorCommand("drain", "bad HBM", slice=1)), HoldTrainer)
    job.feed(TrainerHeld(hold.generation, 5, 5))
    job.feed(Tick(), dt=10 * NOTICE_STALE_SECONDS)
    assert 1 in job.state.drains


def test_undrain_force_lifts_a_notice_drain_and_plain_undrain_points_to_it() -> None:
    job = Job()
    _drained_and_held(job, "node-3", 3, job.now + 86400.0)
    d = job.feed(OperatorCommand("undrain", "notice is wrong", slice=3))
    assert d.rejected and "notice" in d.rejected and "--force" in d.rejected and 3 in job.state.drains
    d = job.feed(OperatorCommand("undrain", "notice is wrong", slice=3, force=True))
    assert not d.rejected and 3 not in job.state.drains, d.reason
    assert "notice is wrong" in d.reason and "forced" in d.reason
    assert one(d, HoldTrainer).flush is False  # grows back onto slice 3
    # A planned drain goes too (else it would begin later), and --force on nothing is still refused.
    job = scheduled_job()
    job.notice(node="node-2", starts_at=job.now + 900.0, event_time=1.0)
    d = job.feed(OperatorCommand("undrain", "x", slice=2, force=True))
    assert not d.rejected and job.state.planned == {} and "planned drain" in d.reason
    assert "not drained" in job.feed(OperatorCommand("undrain", "x", slice=1, force=True)).rejected


def test_operator_abort_stops_or_restarts() -> None:
    job = Job()
    d = job.feed(OperatorCommand("abort", "bad run"))
    assert one(d, AbortTrainer).exit_code == 3 and ExitCoordinator(3, "operator abort: bad run") in d.actions
    job = Job()
    d = job.feed(OperatorCommand("abort", "restart please", restart=True))
    assert one(d, AbortTrainer).exit_code == 42
    assert job.feed(OperatorCommand("hold", "too late")).rejected


def test_a_replaced_slice_can_be_drained_again_and_its_loss_is_a_failure() -> None:
    job = Job(min_slices=2)
    hold = one(job.notice(node="node-1"), HoldTrainer)
    job.feed(TrainerHeld(hold.generation, 5, 5))
    hold = one(job.feed(WorkerJoined(1, 0, "b1", node="node-1b")), HoldTrainer)  # replacement: grow back
    assert 1 not in job.state.drains
    job.feed(TrainerHeld(hold.generation, 6, 6))
    assert 1 in job.state.active
    again = one(job.notice(node="node-1b"), HoldTrainer)
    assert 1 in again.down_slices and job.state.drains[1].node == "node-1b"


def test_a_second_notice_while_a_hold_is_pending_also_drains_from_memory() -> None:
    job = Job(min_slices=1)
    first = one(job.notice(node="node-1"), HoldTrainer)
    assert first.snapshot and job.state.phase == Phase.HOLDING
    second = one(job.notice(node="node-2"), HoldTrainer)  # before the trainer acknowledged the first
    assert (
        second.snapshot and not second.flush and second.down_slices == frozenset({1, 2}) and job.state.retries_used == 0
    )
