"""StragglerVerdict in the decision core: a drain as an operator's, its limits, and no action otherwise;
under --straggler-replace, a ReplaceSlice once the job runs without the slice, and the grow back."""

from __future__ import annotations

import pytest

from agent.core.model import (
    HoldTrainer,
    OperatorCommand,
    Phase,
    ReplaceSlice,
    ResumeTrainer,
    StragglerVerdict,
    TrainerHeld,
    TrainerResumed,
    WorkerJoined,
    WorkerLost,
)
from tests.core.driver import Job as _Job
from tests.core.driver import Policy, of, one


class Job(_Job):
    """A running job of ``n`` one-host slices; 0.1 s per event."""

    def __init__(
        self,
        n: int = 4,
        min_slices: int = 2,
        interval: float = 3600.0,
        *,
        replace: bool = False,
        hosts: int = 1,
        settle: float = 0.0,
    ) -> None:
        policy = Policy(
            num_slices=n,
            hosts_per_slice=hosts,
            elastic_min_slice_count=min_slices,
            straggler_drain_interval_seconds=interval,
            straggler_replace=replace,
            settle_seconds=settle,
        )
        super().__init__(policy, dt=0.1)
        self.join_all()
        self.attach_and_start("fresh")

    def drained(self, s: int) -> None:
        """Carry a straggler drain of slice ``s`` through to training on the others."""
        hold = one(self.feed(StragglerVerdict(s, "slice", "drain", "slow")), HoldTrainer)
        resume = one(self.feed(TrainerHeld(hold.generation, 50, 50)), ResumeTrainer)
        self.feed(TrainerResumed(resume.generation, 50, resume.active, str(resume.source)))


def test_drain_holds_from_memory_and_resumes_without_the_slice_and_spends_no_retry() -> None:
    job = Job()
    d = job.feed(StragglerVerdict(2, "slice", "drain", "late 30% for 3 windows", slowdown=0.3, lateness=0.3, since=5.0))
    hold = one(d, HoldTrainer)
    assert hold.snapshot and 2 in hold.down_slices and not d.rejected
    assert job.state.drains[2].source == "straggler" and job.state.retries_used == 0
    resume = one(job.feed(TrainerHeld(hold.generation, 40, 40)), ResumeTrainer)
    assert resume.active == frozenset({0, 1, 3})


@pytest.mark.parametrize(
    ("verdict", "why"),
    [
        (StragglerVerdict(1, "slice", "drain", "slow"), "fewer than the 4"),  # all slices required
        (StragglerVerdict(7, "slice", "drain", "slow"), "a slice of this job"),
        (StragglerVerdict(-1, "job", "drain", "slow"), "a slice of this job"),
        (StragglerVerdict(1, "slice", "evict", "slow"), "unknown action"),
    ],
)
def test_refused_drains_change_nothing_and_say_why(verdict: StragglerVerdict, why: str) -> None:
    job = Job(min_slices=-1)
    before = job.state
    d = job.feed(verdict)
    assert why in d.rejected and d.actions == () and job.state == before, d.reason


def test_at_most_one_straggler_drain_per_interval_unless_an_operator_asks() -> None:
    job = Job(n=5, min_slices=2, interval=3600.0)
    job.drained(1)
    d = job.feed(StragglerVerdict(3, "slice", "drain", "slow too"))
    assert "at most one straggler drain" in d.rejected and 3 not in job.state.drains
    asked = job.feed(StragglerVerdict(3, "slice", "drain", "slow too", operator_asked=True))
    assert not asked.rejected and 3 in job.state.drains
    one(asked, HoldTrainer)


def test_the_interval_counts_from_the_last_straggler_drain() -> None:
    job = Job(n=5, min_slices=2, interval=10.0)
    job.drained(1)
    job.now += 11.0
    d = job.feed(StragglerVerdict(3, "slice", "drain", "slow too"))
    assert not d.rejected and 3 in job.state.drains


@pytest.mark.parametrize("action", ["alert", "keep"])
@pytest.mark.parametrize(("slice_", "scope"), [(2, "slice"), (-1, "job")])
def test_alert_and_keep_are_no_action(action: str, slice_: int, scope: str) -> None:
    job = Job()
    before = job.state
    d = job.feed(StragglerVerdict(slice_, scope, action, "job-wide slowdown 30%"))
    assert d.actions == () and not d.rejected and job.state == before
    assert action in d.reason and "job-wide slowdown 30%" in d.reason


def test_a_drain_while_not_running_is_refused() -> None:
    job = Job()
    job.feed(OperatorCommand("hold", "look"))
    assert job.state.phase == Phase.HOLDING
    d = job.feed(StragglerVerdict(2, "slice", "drain", "slow"))
    assert "not running" in d.rejected and 2 not in job.state.drains


def test_an_operator_undrains_a_straggler_drain_without_force() -> None:
    job = Job()
    job.drained(2)
    d = job.feed(OperatorCommand("undrain", "node fixed", slice=2))
    assert not d.rejected and 2 not in job.state.drains, d.reason


# -- --straggler-replace ------------------------------------------------------------------------


@pytest.mark.parametrize("replace", [True, False])
def test_replace_goes_out_once_the_job_runs_without_the_slice_and_only_when_on(replace: bool) -> None:
    job = Job(replace=replace, hosts=2)
    drain = job.feed(StragglerVerdict(2, "slice", "drain", "late 30%"))
    hold = one(drain, HoldTrainer)
    # Not with the drain, nor at the hold's acknowledgement: the slice's pods serve the step the
    # trainer is finishing until it resumed without them.
    held = job.feed(TrainerHeld(hold.generation, 50, 50))
    assert of(drain, ReplaceSlice) == [] and of(held, ReplaceSlice) == []
    resume = one(held, ResumeTrainer)
    resumed = job.feed(TrainerResumed(resume.generation, 50, resume.active, str(resume.source)))
    if replace:
        assert one(resumed, ReplaceSlice).slice == 2 and "replacing straggler slice(s) [2]" in resumed.reason
        assert not job.state.drains[2].replace  # asked for once
    else:
        assert of(resumed, ReplaceSlice) == [] and "replacing" not in resumed.reason
    # A later resume (a re-synchronisation) does not ask again.
    again = job.feed(OperatorCommand("hold", "look"))
    held = job.feed(TrainerHeld(one(again, HoldTrainer).generation, 60, 60))
    job.feed(OperatorCommand("resume", "done"))
    later = [d for d in job.decisions[-3:] if of(d, ResumeTrainer)]
    assert later, [d.reason for d in job.decisions[-3:]]
    r = one(later[-1], ResumeTrainer)
    assert of(job.feed(TrainerResumed(r.generation, 60, r.active, str(r.source))), ReplaceSlice) == []


def test_the_replaced_slice_grows_back_when_its_new_hosts_register() -> None:
    job = Job(replace=True, hosts=2)
    job.drained(2)
    assert job.decisions[-1].actions == (ReplaceSlice(2, job.decisions[-1].actions[0].reason),)
    # The pods are deleted: their sidecars go, which costs no retry and holds nothing (the slice is out).
    for h in range(2):
        d = job.feed(WorkerLost(2, h, f"a2.{h}", "stream_closed"))
        assert d.actions == () and job.state.phase == Phase.RUNNING, d.reason
    assert job.state.retries_used == 0
    # The JobSet's new pods register new incarnations: the drain is lifted and the job grows onto them.
    job.feed(WorkerJoined(2, 0, "b2.0"))
    grow = job.feed(WorkerJoined(2, 1, "b2.1"))
    hold = one(grow, HoldTrainer)
    assert 2 not in job.state.drains and job.state.retries_used == 0
    resume = one(job.feed(TrainerHeld(hold.generation, 70, 70)), ResumeTrainer)
    assert resume.active == frozenset({0, 1, 2, 3})


def test_a_slice_already_being_replaced_is_not_replaced_again() -> None:
    """A host of the slice registered anew during the hold (its node went) and has not settled yet, so the
    drain stands: its new pod is left alone."""
    job = Job(replace=True, hosts=2, settle=30.0)
    hold = one(job.feed(StragglerVerdict(2, "slice", "drain", "late 30%")), HoldTrainer)
    job.feed(WorkerLost(2, 0, "a2.0", "stream_closed"))
    job.feed(WorkerJoined(2, 0, "b2.0"))
    resume = one(job.feed(TrainerHeld(hold.generation, 50, 50)), ResumeTrainer)
    assert 2 not in resume.active and 2 in job.state.drains
    resumed = job.feed(TrainerResumed(resume.generation, 50, resume.active, str(resume.source)))
    assert of(resumed, ReplaceSlice) == [], resumed.reason


def test_an_operator_drain_is_never_replaced() -> None:
    job = Job(replace=True)
    hold = one(job.feed(OperatorCommand("drain", "maintenance", slice=1)), HoldTrainer)
    resume = one(job.feed(TrainerHeld(hold.generation, 50, 50)), ResumeTrainer)
    resumed = job.feed(TrainerResumed(resume.generation, 50, resume.active, str(resume.source)))
    assert 1 not in resume.active and of(resumed, ReplaceSlice) == []
