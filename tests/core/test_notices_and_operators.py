"""Proactive drains from notices, and operator commands, in the decision core."""

from __future__ import annotations

from agent.core.decide import decide
from agent.core.model import (
    AbortTrainer,
    Decision,
    ExitCoordinator,
    FlushTrainer,
    HoldTrainer,
    NodeNotice,
    OperatorCommand,
    Phase,
    ResumeTrainer,
    State,
    TrainerAttached,
    TrainerHeld,
    TrainerResumed,
    WorkerJoined,
    initial_state,
)
from agent.core.model import (
    Policy as _Policy,
)


def Policy(**kw) -> _Policy:  # noqa: N802
    """The policy under test, with no settle period: these tests check other
    rules; the settle period has its own tests (test_membership.py)."""
    kw.setdefault("settle_seconds", 0.0)
    return _Policy(**kw)


class Job:
    """A running job of ``n`` one-host slices, nodes named node-S, pools pool-S."""

    def __init__(self, n: int = 4, min_slices: int = 2, retries: int = 10) -> None:
        self.now = 0.0
        self.state: State = initial_state(
            Policy(num_slices=n, elastic_min_slice_count=min_slices, elastic_max_retries=retries), 0.0
        )
        for s in range(n):
            self.step(WorkerJoined(s, 0, f"a{s}", node=f"node-{s}", node_pool=f"pool-{s // 2}"))
        d = self.step(TrainerAttached(0, -1))
        resume = _one(d, ResumeTrainer)
        self.step(TrainerResumed(resume.generation, 0, resume.active, "fresh"))

    def step(self, ev: object, dt: float = 0.1) -> Decision:
        self.now += dt
        d = decide(self.state, ev, self.now)  # type: ignore[arg-type]
        self.state = d.state
        return d

    def notice(self, **kw: object) -> Decision:
        kw.setdefault("deadline", self.now + 60.0)
        return self.step(NodeNotice(kind="terminate_on_host_maintenance", source="pubsub", **kw))  # type: ignore[arg-type]


def _one(d: Decision, kind: type) -> object:
    found = [a for a in d.actions if isinstance(a, kind)]
    assert len(found) == 1, (kind.__name__, d.actions, d.reason)
    return found[0]


def test_notice_drains_the_slice_with_a_flush_and_no_retry() -> None:
    job = Job(min_slices=2)
    d = job.notice(node="node-1")
    hold = _one(d, HoldTrainer)
    assert hold.flush and 1 in hold.down_slices
    assert job.state.retries_used == 0 and job.state.phase == Phase.HOLDING
    d = job.step(TrainerHeld(hold.generation, 40, 40))
    resume = _one(d, ResumeTrainer)
    assert resume.active == frozenset({0, 2, 3}) and str(resume.source) == "memory"


def test_notice_with_all_slices_required_waits_for_the_replacement() -> None:
    job = Job(min_slices=-1)
    hold = _one(job.notice(node="node-2"), HoldTrainer)
    d = job.step(TrainerHeld(hold.generation, 10, 10))
    assert d.actions == () and job.state.phase == Phase.WAITING
    d = job.step(WorkerJoined(2, 0, "b2", node="node-2-new"))
    assert _one(d, ResumeTrainer).active == frozenset(range(4))


def test_notice_past_its_deadline_is_a_failure() -> None:
    job = Job()
    d = job.notice(node="node-1", deadline=job.now - 1.0)
    assert isinstance(_one(d, HoldTrainer), HoldTrainer)
    assert job.state.retries_used == 1


def test_cleared_notice_lifts_the_drain_and_grows_back() -> None:
    job = Job()
    hold = _one(job.notice(node="node-3", event_time=100.0), HoldTrainer)
    job.step(TrainerHeld(hold.generation, 5, 5))
    assert 3 not in job.state.active
    d = job.notice(node="node-3", cleared=True, event_time=101.0)
    assert 3 not in job.state.drains
    assert _one(d, HoldTrainer).flush is False  # growing back loses nothing, no flush needed


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
    assert _one(d, HoldTrainer).down_slices == frozenset({2, 3})


def test_operator_hold_stays_held_until_an_operator_resumes() -> None:
    job = Job()
    hold = _one(job.step(OperatorCommand("hold", "maintenance window")), HoldTrainer)
    assert hold.flush and job.state.operator_hold
    d = job.step(TrainerHeld(hold.generation, 7, 7))
    assert d.actions == () and job.state.phase == Phase.WAITING
    d = job.step(OperatorCommand("resume", "done"), dt=1000.0)  # no timeout while an operator holds
    assert _one(d, ResumeTrainer).active == frozenset(range(4))


def test_operator_resume_while_running_is_refused() -> None:
    job = Job()
    before = job.state
    d = job.step(OperatorCommand("resume", "why not"))
    assert d.rejected and "running" in d.rejected and job.state == before


def test_operator_drain_checkpoint_and_bad_slice() -> None:
    job = Job()
    assert _one(job.step(OperatorCommand("drain", "bad HBM", slice=1)), HoldTrainer).flush
    assert "slice 9" in job.step(OperatorCommand("drain", "x", slice=9)).rejected
    flush = _one(job.step(OperatorCommand("checkpoint", "before upgrade")), FlushTrainer)
    assert flush.generation == job.state.generation


def test_operator_abort_stops_or_restarts() -> None:
    job = Job()
    d = job.step(OperatorCommand("abort", "bad run"))
    assert _one(d, AbortTrainer).exit_code == 3 and ExitCoordinator(3, "operator abort: bad run") in d.actions
    job = Job()
    d = job.step(OperatorCommand("abort", "restart please", restart=True))
    assert _one(d, AbortTrainer).exit_code == 42
    assert job.step(OperatorCommand("hold", "too late")).rejected


def test_a_replaced_slice_can_be_drained_again_and_its_loss_is_a_failure() -> None:
    job = Job(min_slices=2)
    hold = _one(job.notice(node="node-1"), HoldTrainer)
    job.step(TrainerHeld(hold.generation, 5, 5))
    hold = _one(job.step(WorkerJoined(1, 0, "b1", node="node-1b")), HoldTrainer)  # replacement: grow back
    assert 1 not in job.state.drains
    job.step(TrainerHeld(hold.generation, 6, 6))
    assert 1 in job.state.active
    again = _one(job.notice(node="node-1b"), HoldTrainer)
    assert 1 in again.down_slices and job.state.drains[1].node == "node-1b"
