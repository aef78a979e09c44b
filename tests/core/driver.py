"""The one test driver of the decision core: feeds events to ``decide`` at a clock the test moves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.core.decide import decide
from agent.core.model import (
    Decision,
    HoldTrainer,
    NodeNotice,
    Phase,
    ResumeTrainer,
    State,
    TrainerAttached,
    TrainerHeld,
    TrainerResumed,
    TrainerStepped,
    WorkerJoined,
    initial_state,
)
from agent.core.model import Policy as _Policy

Check = Callable[[State, object, float, Decision], None]
"""Called after each step with the state before, the event, the time and the decision."""


def Policy(**kw: Any) -> _Policy:  # noqa: N802
    """The policy under test, with no settle period: most tests check other rules; the settle
    period has its own tests (test_membership.py)."""
    kw.setdefault("settle_seconds", 0.0)
    return _Policy(**kw)


class Job:
    """Feeds events into ``decide`` at a controllable clock and keeps the state.

    ``dt`` is how far the clock moves per event unless the step says otherwise; ``check`` runs
    after every step (a property test's per-step invariants).
    """

    def __init__(self, policy: _Policy, now: float = 0.0, *, dt: float = 0.0, check: Check | None = None) -> None:
        self.now = now
        self.state = initial_state(policy, now)
        self.decisions: list[Decision] = []
        self.dt = dt
        self.check = check

    def feed(self, event: Any, dt: float | None = None) -> Decision:
        self.now += self.dt if dt is None else dt
        before = self.state
        d = decide(before, event, self.now)
        assert isinstance(d.reason, str) and d.reason.strip(), f"empty reason for {event!r}"
        if self.check is not None:
            self.check(before, event, self.now, d)
        self.state = d.state
        self.decisions.append(d)
        return d

    def join_all(self, inc: str = "a", *, nodes: bool = False) -> Decision:
        """Every host registers; ``nodes``: one-host slices on nodes node-S in pools pool-S/2."""
        p = self.state.policy
        d = None
        for s in range(p.num_slices):
            for h in range(p.hosts_per_slice):
                if nodes:
                    d = self.feed(WorkerJoined(s, h, f"{inc}{s}", node=f"node-{s}", node_pool=f"pool-{s // 2}"))
                else:
                    d = self.feed(WorkerJoined(s, h, f"{inc}{s}.{h}"))
        assert d is not None
        return d

    def attach_and_start(self, restored_from: str = "checkpoint") -> ResumeTrainer:
        """The trainer attaches fresh and acknowledges the start."""
        d = self.feed(TrainerAttached(generation=0, step_in_memory=-1))
        (resume,) = of(d, ResumeTrainer)
        self.feed(TrainerResumed(resume.generation, 0, resume.active, restored_from))
        return resume

    def start(self, *, timed_steps: int = 0) -> Decision:
        """All hosts up, trainer attached, start acknowledged: RUNNING.

        Then one step report (step 10), or ``timed_steps`` reports of 0.5 s steps, which give the
        hang rule a median.
        """
        self.join_all()
        self.attach_and_start()
        attached = self.decisions[-2]
        g = self.state.generation
        if timed_steps:
            for step in range(1, timed_steps + 1):
                self.feed(TrainerStepped(step, g, 0.5), dt=0.5)
        else:
            self.feed(TrainerStepped(10, g), dt=1.0)
        assert self.state.phase == Phase.RUNNING
        return attached

    def ack_hold(self, d: Decision, *, step: int = 10, committed: int = -1) -> Decision:
        (hold,) = of(d, HoldTrainer)
        return self.feed(TrainerHeld(hold.generation, step, committed), dt=0.5)

    def ack_resume(self, d: Decision, *, step: int = 10) -> Decision:
        (resume,) = of(d, ResumeTrainer)
        return self.feed(TrainerResumed(resume.generation, step, resume.active, str(resume.source)), dt=0.5)

    def notice(self, **kw: Any) -> Decision:
        """A maintenance notice from Pub/Sub, due in 60 s unless ``deadline`` says otherwise."""
        kw.setdefault("deadline", self.now + 60.0)
        return self.feed(NodeNotice(kind="terminate_on_host_maintenance", source="pubsub", **kw))


def of(d: Decision, kind: type) -> list:
    return [a for a in d.actions if isinstance(a, kind)]


def one(d: Decision, kind: type) -> Any:
    found = of(d, kind)
    assert len(found) == 1, (kind.__name__, d.actions, d.reason)
    return found[0]


def kinds(d: Decision) -> list[type]:
    return [type(a) for a in d.actions]
