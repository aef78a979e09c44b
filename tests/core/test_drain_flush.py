"""Which drains flush to storage and which go on from memory, and the notice's lead against the flush time.

On Pathways a drain whose slices that remain hold a replica of the state holds with a snapshot (nothing
to storage); a flush is made only when no replica would be kept (the last slices, a notice covering
all of them, a minimum no slice may leave) or in a multi-controller job. docs/notices.md has the rules.
"""

from __future__ import annotations

import pytest

from agent.core.model import (
    HoldTrainer,
    NodeNotice,
    OperatorCommand,
    Phase,
    ResumeTrainer,
    Tick,
    TrainerAttached,
    TrainerDetached,
    TrainerFlushed,
    TrainerHeld,
)
from tests.core.driver import Job, Policy, one


def running(n: int = 4, min_slices: int = 2, **kw: object) -> Job:
    """A running job of ``n`` one-host slices on nodes node-S in pools pool-S/2."""
    job = Job(Policy(num_slices=n, elastic_min_slice_count=min_slices, **kw), dt=0.1)
    job.join_all(nodes=True)
    job.attach_and_start("fresh")
    return job


def timed_flush(job: Job, nbytes: int, seconds: float) -> None:
    """The trainer reports a flush it timed (an operator checkpoint): the core learns the rate."""
    job.feed(TrainerFlushed(job.state.generation, 5, seconds, nbytes))


def test_a_drain_that_leaves_a_replica_holds_with_a_snapshot_and_resumes_from_memory() -> None:
    job = running(min_slices=2)
    d = job.notice(node="node-1")
    hold = one(d, HoldTrainer)
    assert hold.snapshot and not hold.flush and hold.down_slices == frozenset({1})
    assert "nothing to storage" in d.reason and "with snapshot" in d.reason
    # The trainer may fall back to a flush (no replica per slice): the acknowledgement is awaited that long.
    p = job.state.policy
    assert job.state.deadline == job.now + p.elastic_timeout_seconds + p.flush_timeout_seconds
    d = job.feed(TrainerHeld(hold.generation, 40, 20))
    resume = one(d, ResumeTrainer)
    assert resume.active == frozenset({0, 2, 3}) and str(resume.source) == "memory"


def test_an_operator_drain_leaving_a_replica_holds_with_a_snapshot() -> None:
    job = running(min_slices=2)
    hold = one(job.feed(OperatorCommand("drain", "bad HBM", slice=3)), HoldTrainer)
    assert hold.snapshot and not hold.flush


def test_draining_the_last_slice_flushes() -> None:
    job = running(n=1, min_slices=1)
    d = job.notice(node="node-0")
    hold = one(d, HoldTrainer)
    assert hold.flush and not hold.snapshot
    assert "no slice would remain to hold a replica" in d.reason


def test_a_notice_covering_every_slice_flushes() -> None:
    job = running(n=2, min_slices=1)
    d = job.notice(node_pool="pool-0")  # both slices' nodes are in pool-0
    hold = one(d, HoldTrainer)
    assert hold.flush and hold.down_slices == frozenset({0, 1}) and "no slice would remain" in d.reason


def test_a_minimum_that_no_slice_may_leave_flushes() -> None:
    job = running(min_slices=-1)
    d = job.notice(node="node-2")
    hold = one(d, HoldTrainer)
    assert hold.flush and not hold.snapshot
    assert "3 slice(s) would remain, fewer than the minimum 4" in d.reason


def test_a_multi_controller_drain_flushes() -> None:
    job = Job(Policy(num_slices=2, trainer_processes=2), dt=0.1)
    job.start()
    d = job.feed(NodeNotice("terminate", "metadata", slice=1, reason="maintenance"))
    hold = one(d, HoldTrainer)
    assert hold.flush and not hold.snapshot and "multi-controller" in d.reason


def test_a_second_drain_that_leaves_too_few_while_held_from_memory_flushes() -> None:
    job = running(min_slices=3)
    first = one(job.notice(node="node-1"), HoldTrainer)
    assert first.snapshot
    second = one(job.notice(node="node-2"), HoldTrainer)  # 2 would remain, minimum 3
    assert second.flush and not second.snapshot and second.down_slices == frozenset({1, 2})


def test_a_pending_snapshot_hold_is_sent_again_as_one() -> None:
    job = running(min_slices=2)
    hold = one(job.notice(node="node-1", deadline=job.now + 30.0), HoldTrainer)
    assert hold.prepare_wait == pytest.approx(15.0, abs=0.1)  # the feed moved the clock on by its step
    job.feed(TrainerDetached())
    again = one(job.feed(TrainerAttached(generation=hold.generation - 1, step_in_memory=12)), HoldTrainer)
    assert again == hold


def test_a_drain_from_memory_trains_on_for_the_next_mesh_at_most_half_the_notice_lead() -> None:
    # A Spot VM's 30 s, the default 120 s, a host already going.
    job = running(min_slices=2)
    assert one(job.notice(node="node-1", deadline=job.now + 30.0), HoldTrainer).prepare_wait == pytest.approx(
        15.0, abs=0.1
    )
    job = running(min_slices=2)
    assert one(job.notice(node="node-1", deadline=job.now + 120.0), HoldTrainer).prepare_wait == pytest.approx(
        60.0, abs=0.1
    )
    job = running(min_slices=2)
    assert one(job.notice(node="node-1", deadline=job.now - 5.0), HoldTrainer).prepare_wait == 0.0  # going now


def test_the_prepare_wait_leaves_the_flush_timeout_of_the_holds_acknowledgement_bound() -> None:
    job = running(min_slices=2, elastic_timeout_seconds=40.0)
    hold = one(job.notice(node="node-1", deadline=job.now + 600.0), HoldTrainer)
    assert hold.prepare_wait == 40.0
    assert job.state.deadline - job.now - hold.prepare_wait == job.state.policy.flush_timeout_seconds


def test_without_a_notice_time_the_trainer_waits_its_own_default_and_a_flush_never_waits() -> None:
    job = running(min_slices=2)
    assert one(job.feed(OperatorCommand("drain", "bad HBM", slice=3)), HoldTrainer).prepare_wait is None
    job = running(min_slices=-1)
    flush = one(job.notice(node="node-1", deadline=job.now + 30.0), HoldTrainer)
    assert flush.flush and flush.prepare_wait is None


def test_without_timed_flushes_the_expected_flush_time_is_unknown() -> None:
    job = running(min_slices=-1)
    d = job.notice(node="node-1", deadline=job.now + 30.0)
    assert "expected flush time unknown" in d.reason and "lead 30 s" in d.reason


def test_a_lead_longer_than_the_expected_flush_is_said_so() -> None:
    job = running(min_slices=-1)
    timed_flush(job, 4_000_000_000, 2.0)  # 2 GB/s
    d = job.notice(node="node-1", deadline=job.now + 60.0)
    assert "expected flush 2.0 s (4 GB at 2 GB/s measured), lead 60 s" in d.reason, d.reason
    assert "at once" not in d.reason


def test_a_lead_shorter_than_the_expected_flush_flushes_at_once_and_says_so() -> None:
    job = running(min_slices=-1)
    timed_flush(job, 90_000_000_000, 90.0)  # 90 GB at 1 GB/s: 90 s
    d = job.notice(node="node-1", deadline=job.now + 30.0)
    hold = one(d, HoldTrainer)
    assert hold.flush and job.state.phase == Phase.HOLDING
    assert "the notice's lead (30 s) is shorter than the expected flush 90.0 s" in d.reason, d.reason
    assert "flushing at once" in d.reason


def test_the_rate_is_the_trainers_newest_timed_flushes_and_an_untimed_commit_says_nothing() -> None:
    job = running(min_slices=-1)
    timed_flush(job, 1_000_000_000, 1.0)
    timed_flush(job, 3_000_000_000, 3.0)
    job.feed(TrainerFlushed(job.state.generation, 20))  # a periodic commit: no time, no bytes
    d = job.notice(node="node-1", deadline=job.now + 60.0)
    assert "expected flush 3.0 s (3 GB at 1 GB/s measured)" in d.reason, d.reason


def test_a_planned_drain_that_will_flush_begins_the_expected_flush_time_before_the_window() -> None:
    job = running(min_slices=-1)
    timed_flush(job, 300_000_000_000, 300.0)  # 300 s, longer than the 120 s lead
    start = job.now + 1000.0
    d = job.notice(node="node-1", starts_at=start, event_time=1.0)
    assert d.actions == () and job.state.planned[1].since == start - 300.0, job.state.planned
    assert "the expected flush, 300 s, is longer than the 120 s lead" in d.reason, d.reason
    hold = one(job.feed(Tick(), dt=start - 300.0 - job.now + 0.1), HoldTrainer)
    assert hold.flush and job.now < start - 299.0


def test_a_planned_drain_whose_window_is_nearer_than_the_expected_flush_drains_at_once() -> None:
    job = running(min_slices=-1)
    timed_flush(job, 300_000_000_000, 300.0)
    d = job.notice(node="node-1", starts_at=job.now + 200.0, event_time=1.0)
    hold = one(d, HoldTrainer)
    assert hold.flush and "flushing at once" in d.reason, d.reason


def test_a_planned_drain_from_memory_keeps_the_configured_lead() -> None:
    job = running(min_slices=2)
    timed_flush(job, 300_000_000_000, 300.0)  # irrelevant: nothing will be flushed
    start = job.now + 1000.0
    job.notice(node="node-1", starts_at=start, event_time=1.0)
    assert job.state.planned[1].since == start - 120.0
