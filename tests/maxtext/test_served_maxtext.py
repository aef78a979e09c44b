"""The real MaxText (0.2.5, tiny synthetic model, 4 CPU devices) served by a real coordinator.

One job, told as a story so MaxText starts as few times as possible (about
15 s each). The tests run in order and share the :class:`Story`; each checks
one case and fails fast if an earlier one it builds on did not get there.

* run 1 (served): (b) an operator hold stops it at a step boundary until the
  operator resumes; (a) an operator checkpoint commits the step it names; it
  then trains to its last step with no further checkpoint.
* run 2 (served, same run_name, more steps): (a) resumes from exactly that
  step; (c) a maintenance notice for its node holds it with a flush that loses
  no step, and a replacement host lets it go on; (d) an abort flushes and
  exits 42.
* run 3 (plain MaxText via the entry point, no sidecar address) resumes from
  exactly the abort's step; beside it an uninterrupted reference run. Every
  loss of runs 1-3 equals the reference's for the same step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.core.model import (
    NodeNotice,
    OperatorCommand,
    Phase,
    TrainerFlushed,
    TrainerHeld,
    TrainerResumed,
    TrainerStepped,
    WorkerJoined,
)
from tests.maxtext.harness import (
    START_TIMEOUT,
    MaxTextRun,
    Sidecar,
    checkpoint_labels,
    maxtext_args,
    require_maxtext_venv,
)

pytestmark = pytest.mark.maxtext

RUN = "served"
RUN1_STEPS = 200
RUN2_STEPS = 100_000
"""Run 2 never gets there: it is aborted."""
MORE_STEPS = 10
LOSS_TOLERANCE = 1e-5
QUIET_SECONDS = 1.5
"""How long a held trainer is watched for steps that should not happen."""


@dataclass
class Story:
    out: Path
    runs: list[MaxTextRun] = field(default_factory=list)
    sidecars: list[Sidecar] = field(default_factory=list)
    facts: dict[str, object] = field(default_factory=dict)
    figures: dict[str, list[float]] = field(default_factory=dict)

    def need(self, *keys: str) -> None:
        missing = [k for k in keys if k not in self.facts]
        if missing:
            pytest.fail(f"an earlier test of this story did not get as far as {missing}", pytrace=False)

    def figure(self, name: str, seconds: float) -> None:
        self.figures.setdefault(name, []).append(round(seconds, 3))

    def sidecar(self) -> Sidecar:
        s = Sidecar(num_slices=1)
        self.sidecars.append(s)
        s.submit(WorkerJoined(0, 0, "inc-1", node="node-0"))
        return s

    def start(
        self, name: str, steps: int, sidecar: Sidecar | None, run_name: str = RUN, fresh_cache: bool = False
    ) -> MaxTextRun:
        args = maxtext_args(self.out, run_name, steps, fresh_cache=fresh_cache)
        run = MaxTextRun(name, args, self.out, sidecar=sidecar)
        self.runs.append(run)
        return run


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    require_maxtext_venv()
    out = tmp_path_factory.mktemp("maxtext")
    s = Story(out=out)
    try:
        yield s
    finally:
        for r in s.runs:
            r.kill()
        for c in s.sidecars:
            c.stop()
        if s.figures:
            print("\nserved MaxText figures (seconds):")
            for k, v in s.figures.items():
                print(f"  {k}: {v}")


def first_step(sidecar: Sidecar, run: MaxTextRun, after: int = 0) -> int:
    return sidecar.wait_for(
        lambda: sidecar.state.trainer.last_step > after and sidecar.state.trainer.last_step,
        f"{run.name} to complete a step after step {after}",
        run,
        timeout=START_TIMEOUT,
    )


# ---------------------------------------------------------------------------
# run 1
# ---------------------------------------------------------------------------


def test_b_hold_stops_at_a_step_boundary_until_resume(story: Story) -> None:
    sc = story.sidecar()
    run = story.start("run1", RUN1_STEPS, sc, fresh_cache=True)  # an empty cache: its start figure is a new job's
    story.facts["run1"] = run
    first_step(sc, run)
    sc.wait_for(lambda: sc.applied(TrainerStepped), "the first step report", run)
    story.figure(
        "start: process start to first step (cold compile cache)", sc.applied(TrainerStepped)[0].at - run.started
    )
    assert sc.state.phase == Phase.RUNNING
    assert sc.state.policy.elastic_min_slice_count == -1  # adopted from MaxText's flags (its default)

    t0 = time.monotonic()
    sc.request(OperatorCommand("hold", "test (b)"))
    sc.wait_for(lambda: sc.applied(TrainerHeld, since=t0), "the trainer to acknowledge the hold", run)
    held = sc.applied(TrainerHeld)[-1]
    assert sc.state.phase == Phase.WAITING
    story.figure("hold: command to HeldAck (incl. flush)", held.at - t0)
    story.figure("flush (trainer-measured)", held.event.flush_seconds)
    h = sc.state.trainer.last_step
    assert held.event.step == h
    assert held.event.committed_step == h, "an operator hold flushes: nothing after the committed step"

    logged = len(run.logged_steps())
    time.sleep(QUIET_SECONDS)
    assert sc.state.trainer.last_step == h, "steps went on while held"
    assert not sc.applied(TrainerStepped, since=held.at), "the trainer reported steps while held"
    assert len(run.logged_steps()) == logged, "MaxText logged steps while held"
    assert run.poll() is None

    t1 = time.monotonic()
    sc.request(OperatorCommand("resume", "test (b)"))
    after = first_step(sc, run, after=h)
    story.figure("resume: command to next step", time.monotonic() - t1)
    resumed = sc.applied(TrainerResumed)[-1].event
    assert (resumed.step, resumed.restored_from) == (h, "memory")
    assert after > h
    story.facts["run1_held_at"] = h


def test_a_checkpoint_command_commits_the_step(story: Story) -> None:
    story.need("run1_held_at")
    run: MaxTextRun = story.facts["run1"]  # type: ignore[assignment]
    sc = story.sidecars[0]
    t0 = time.monotonic()
    before = len(sc.applied(TrainerFlushed))
    d = sc.request(OperatorCommand("checkpoint", "test (a)"))
    assert not d.rejected, d.rejected
    sc.wait_for(lambda: len(sc.applied(TrainerFlushed)) > before, "the flush acknowledgement", run)
    ack = sc.applied(TrainerFlushed)[-1]
    story.figure("checkpoint: command to FlushedAck", ack.at - t0)
    story.figure("flush (trainer-measured)", ack.event.flush_seconds)
    c = ack.event.committed_step
    assert c > story.facts["run1_held_at"]  # type: ignore[operator]
    assert c - 1 in checkpoint_labels(story.out, RUN), "MaxText labels the state after c steps c-1"
    assert sc.state.trainer.committed_step == c

    assert run.wait() == 0, run.tail()
    assert checkpoint_labels(story.out, RUN)[-1] == c - 1, "nothing but the sidecar's flushes checkpoints"
    assert max(run.logged_steps()) == RUN1_STEPS - 1
    assert sc.state.phase == Phase.COMPLETED
    story.facts["checkpoint_step"] = c


# ---------------------------------------------------------------------------
# run 2
# ---------------------------------------------------------------------------


def test_a_a_fresh_run_resumes_from_exactly_the_flushed_step(story: Story) -> None:
    story.need("checkpoint_step")
    c: int = story.facts["checkpoint_step"]  # type: ignore[assignment]
    sc = story.sidecar()
    run = story.start("run2", RUN2_STEPS, sc, fresh_cache=True)  # an empty cache: its restart figure is a new job's
    story.facts["run2"] = run
    sc.wait_for(lambda: sc.applied(TrainerResumed), "the restarted trainer to resume", run, timeout=START_TIMEOUT)
    resumed = sc.applied(TrainerResumed)[0].event
    assert (resumed.step, resumed.restored_from) == (c, "checkpoint")
    sc.wait_for(lambda: sc.applied(TrainerStepped), "the restarted trainer's first step", run)
    story.figure(
        "restart: process start to first step (a fresh compile cache, as a new job's)",
        sc.applied(TrainerStepped)[0].at - run.started,
    )
    sc.wait_for(lambda: run.logged_steps(), "MaxText to log a step", run)
    assert min(run.logged_steps()) == c, "MaxText's first step after the restore is step index c"
    story.facts["run2_resumed"] = c


def test_c_drain_notice_holds_with_a_flush_and_loses_no_step(story: Story) -> None:
    story.need("run2_resumed")
    run: MaxTextRun = story.facts["run2"]  # type: ignore[assignment]
    sc = story.sidecars[1]
    t0 = time.monotonic()
    notice = NodeNotice(
        kind="terminate_on_host_maintenance", source="pubsub", node="node-0", deadline=t0 + 60, reason="test (c)"
    )
    sc.request(notice)
    sc.wait_for(lambda: sc.applied(TrainerHeld, since=t0), "the drained trainer to hold", run)
    held = sc.applied(TrainerHeld)[-1]
    assert sc.state.phase == Phase.WAITING
    story.figure("drain: notice to HeldAck (incl. flush)", held.at - t0)
    story.figure("flush (trainer-measured)", held.event.flush_seconds)
    d = sc.state.trainer.last_step
    assert held.event.step == d
    assert held.event.committed_step == d, "lost steps: committed step != last completed step"
    assert d - 1 in checkpoint_labels(story.out, RUN)
    time.sleep(0.5)
    assert sc.state.trainer.last_step == d and sc.state.phase == Phase.WAITING  # waits for a replacement

    t1 = time.monotonic()
    sc.request(WorkerJoined(0, 0, "inc-2", node="node-0"))
    first_step(sc, run, after=d)
    story.figure("drain: replacement registered to next step", time.monotonic() - t1)
    resumed = sc.applied(TrainerResumed)[-1].event
    assert resumed.step == d, "training resumed from a step other than the one it held at"
    assert sc.state.phase == Phase.RUNNING
    story.facts["run2_drained"] = d


def test_d_abort_exits_42_with_the_state_flushed(story: Story) -> None:
    story.need("run2_drained")
    run: MaxTextRun = story.facts["run2"]  # type: ignore[assignment]
    sc = story.sidecars[1]
    first_step(sc, run, after=story.facts["run2_drained"])  # type: ignore[arg-type]
    t0 = time.monotonic()
    sc.request(OperatorCommand("abort", "test (d)", restart=True))
    assert run.wait(60) == 42, run.tail()
    story.figure("abort: command to exit (incl. flush)", time.monotonic() - t0)
    aborts = run.hook_lines("abort")
    assert aborts and aborts[-1][1]["exit_code"] == 42
    e = aborts[-1][1]["committed_step"]
    # The coordinator stops listening to step reports once it has failed the job,
    # so the step in flight at the abort may be missing there.
    assert e >= sc.state.trainer.last_step
    assert max(run.logged_steps()) == e - 1, "the abort did not flush the last completed step"
    assert checkpoint_labels(story.out, RUN)[-1] == e - 1
    story.facts["aborted_at"] = e


# ---------------------------------------------------------------------------
# run 3, the reference, and the losses
# ---------------------------------------------------------------------------


def test_d_a_rerun_without_sidecar_resumes_from_the_abort_flush(story: Story) -> None:
    story.need("aborted_at")
    e: int = story.facts["aborted_at"]  # type: ignore[assignment]
    end = e + MORE_STEPS
    reference = story.start("reference", max(end, RUN1_STEPS), None, run_name="reference")
    run = story.start("run3", end, None)
    assert run.wait() == 0, run.tail()
    story.figure("restart without sidecar: process start to exit", time.monotonic() - run.started)
    assert "ELASTIC_SIDECAR_ADDRESS is not set" in run.text()
    steps = run.logged_steps()
    assert min(steps) == e and max(steps) == end - 1, sorted(steps)
    assert reference.wait() == 0, reference.tail()
    story.facts["reference"] = reference
    story.facts["run3"] = run


def test_a_losses_after_each_resume_equal_an_uninterrupted_run(story: Story) -> None:
    story.need("reference", "run1", "run2", "run3")
    ref = story.facts["reference"].losses()  # type: ignore[attr-defined]
    compared = 0
    for name in ("run1", "run2", "run3"):
        losses = story.facts[name].losses()  # type: ignore[attr-defined]
        assert losses, f"{name} wrote no metrics"
        for step, loss in sorted(losses.items()):
            assert step in ref, f"{name} step {step} is beyond the reference run"
            assert abs(loss - ref[step]) <= LOSS_TOLERANCE, f"{name} step {step}: loss {loss} != reference {ref[step]}"
            compared += 1
    c, e = story.facts["checkpoint_step"], story.facts["aborted_at"]
    run2 = story.facts["run2"].losses()  # type: ignore[attr-defined]
    run3 = story.facts["run3"].losses()  # type: ignore[attr-defined]
    assert min(run2) == c and min(run3) == e
    assert compared > RUN1_STEPS
