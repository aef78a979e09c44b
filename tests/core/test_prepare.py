"""A notice names the slices that go, so the mesh the job will run on next is known for its whole lead: the core
tells the trainer (``PrepareTrainer``) before the hold, so that the resume onto that mesh need not compile."""

from __future__ import annotations

from agent.core.model import HoldTrainer, NodeNotice, PrepareTrainer, ResumeTrainer, Tick, TrainerHeld
from tests.core.driver import Job, Policy, kinds, one


def running(n: int = 4, min_slices: int = 2, **kw: object) -> Job:
    """A running job of ``n`` one-host slices on nodes node-S in pools pool-S/2."""
    job = Job(Policy(num_slices=n, elastic_min_slice_count=min_slices, **kw), dt=0.1)
    job.join_all(nodes=True)
    job.attach_and_start("fresh")
    return job


def test_a_planned_drain_names_the_slices_that_remain_at_once_and_once() -> None:
    job = running()
    start = job.now + 1000.0
    d = job.notice(node="node-1", starts_at=start, event_time=1.0)
    prepare = one(d, PrepareTrainer)
    assert prepare.active == frozenset({0, 2, 3}) and prepare.generation == job.state.generation
    assert "[0,2,3]" in prepare.reason
    # The same notice again, and the drain beginning at its time: the mesh was already named.
    assert job.notice(node="node-1", starts_at=start, event_time=2.0).actions == ()
    d = job.feed(Tick(), dt=start - 120.0 - job.now + 0.1)
    assert PrepareTrainer not in kinds(d) and HoldTrainer in kinds(d)
    # The resume lands on exactly the mesh that was prepared.
    hold = one(d, HoldTrainer)
    resume = one(job.feed(TrainerHeld(hold.generation, 40, 20)), ResumeTrainer)
    assert resume.active == prepare.active


def test_a_drain_due_now_names_the_next_mesh_before_the_hold() -> None:
    job = running()
    d = job.notice(node="node-2")
    assert kinds(d)[:2] == [PrepareTrainer, HoldTrainer], d.actions
    prepare, hold = d.actions[:2]
    assert prepare.active == frozenset({0, 1, 3}) and prepare.generation == hold.generation


def test_an_earlier_window_moves_the_next_mesh_to_it() -> None:
    job = running()
    one(job.notice(node="node-3", starts_at=job.now + 5000.0, event_time=1.0), PrepareTrainer)
    prepare = one(job.notice(node="node-1", starts_at=job.now + 1000.0, event_time=2.0), PrepareTrainer)
    assert prepare.active == frozenset({0, 2, 3})


def test_nothing_to_prepare_when_the_drain_leaves_too_few_slices() -> None:
    job = running(min_slices=4)
    d = job.notice(node="node-2")
    assert not [a for a in d.actions if isinstance(a, PrepareTrainer)] and one(d, HoldTrainer).flush


def test_nothing_to_prepare_for_a_job_that_cannot_shrink() -> None:
    job = Job(Policy(num_slices=2, trainer_processes=2), dt=0.1)
    job.start()
    d = job.feed(NodeNotice("terminate", "metadata", slice=1, reason="maintenance"))
    assert PrepareTrainer not in kinds(d) and one(d, HoldTrainer).flush


def test_a_cancelled_notice_names_nothing() -> None:
    job = running()
    job.notice(node="node-1", starts_at=job.now + 1000.0, event_time=1.0)
    d = job.notice(node="node-1", cleared=True, event_time=2.0)
    assert d.actions == () and not job.state.planned
