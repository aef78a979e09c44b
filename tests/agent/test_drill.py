"""The drill's phases and verdict from recorded decision sequences (``agent.drill.judge``), its
reading of the decision core's own reasons, and its usage errors (exit 2, nothing deleted)."""

from __future__ import annotations

from typing import Any

import pytest

from agent import constants as C
from agent.cli import main
from agent.core.decide import decide
from agent.core.model import (
    HoldTrainer,
    Policy,
    ResumeTrainer,
    Tick,
    TrainerAttached,
    TrainerHeld,
    TrainerResumed,
    TrainerStepped,
    WorkerJoined,
    WorkerLost,
    initial_state,
)
from agent.drill import Start, judge

T0 = 1_000.0
START = Start(slice=1, deleted_at=T0, generation=1, active=(0, 1, 2, 3), last_step=60, jobset_restarts=0)


def ev(dt: float, trigger: str, reason: str, phase: str, gen: int, active: list[int]) -> dict[str, Any]:
    return {
        "time_unix": T0 + dt,
        "trigger": trigger,
        "reason": reason,
        "phase": phase,
        "generation": gen,
        "active_slices": active,
    }


# A demo run's decisions after `kill:1.0` (from `elastic-sidecar admin events --json`), times from the loss.
RECORDED = [
    ev(-0.9, "TrainerFlushed", "trainer committed step 50", "running", 1, [0, 1, 2, 3]),
    ev(
        0.04,
        "WorkerLost",
        "host 1.0 lost (stream_closed); active slice(s) [1] down; hold generation 2 (recovery 1 of 10)",
        "holding",
        2,
        [0, 1, 2, 3],
    ),
    ev(
        0.09,
        "TrainerHeld",
        "trainer held at step 61, committed step 50; 3 of 4 slices up (minimum 2); resume generation 2 on [0,2,3] from memory",
        "running",
        2,
        [0, 2, 3],
    ),
    ev(0.10, "TrainerResumed", "trainer resumed at step 61 on slices [0,2,3] from memory", "running", 2, [0, 2, 3]),
    ev(4.4, "TrainerFlushed", "trainer committed step 100", "running", 2, [0, 2, 3]),
    ev(5.6, "WorkerJoined", "host 1.0 (gke-demo-slice1-host0-r1) registered", "running", 2, [0, 2, 3]),
    ev(6.6, "Tick", "slice(s) [1] back; growing; hold generation 3", "holding", 3, [0, 2, 3]),
    ev(
        6.63,
        "TrainerHeld",
        "trainer held at step 123, committed step 100; 4 of 4 slices up (minimum 2); resume generation 3 on [0,1,2,3] from memory",
        "running",
        3,
        [0, 1, 2, 3],
    ),
    ev(
        6.65,
        "TrainerResumed",
        "trainer resumed at step 123 on slices [0,1,2,3] from memory",
        "running",
        3,
        [0, 1, 2, 3],
    ),
]


def with_resume(step: int, source: str) -> list[dict[str, Any]]:
    """RECORDED with the first resume at ``step`` from ``source``."""
    out = list(RECORDED)
    out[3] = {**out[3], "reason": f"trainer resumed at step {step} on slices [0,2,3] from {source}"}
    return out


def test_recorded_loss_held_with_every_phase_in_order() -> None:
    r = judge(START, RECORDED, T0 + 5.2, 0)
    assert (r.verdict, r.exit_code) == ("held", C.DRILL_EXIT_HELD)
    assert r.phases == {
        "detected_seconds": 0.04,
        "held_seconds": 0.09,
        "resumed_seconds": 0.1,
        "replacement_running_seconds": 5.2,
        "grown_back_seconds": 6.65,
    }
    assert (r.lost_steps, r.restored_from, r.jobset_restarts) == (0, "memory", 0)
    assert [x["slices"] for x in r.resumes] == [[0, 2, 3], [0, 1, 2, 3]]


def test_a_rewind_to_the_checkpoint_is_lost() -> None:
    r = judge(START, with_resume(50, "checkpoint"), T0 + 5.2, 0)
    assert (r.verdict, r.exit_code) == ("lost", C.DRILL_EXIT_LOST)
    assert r.lost_steps == 11 and r.restored_from == "checkpoint"
    assert "11 steps lost" in r.why


@pytest.mark.parametrize(("step", "verdict"), [(60, "held"), (59, "lost")])
def test_one_lost_step_still_holds_two_do_not(step: int, verdict: str) -> None:
    r = judge(START, with_resume(step, "memory"), T0 + 5.2, 0)
    assert r.verdict == verdict and r.lost_steps == 61 - step


def test_a_jobset_restart_is_lost_even_with_nothing_else_wrong() -> None:
    r = judge(START, RECORDED, T0 + 5.2, 1)
    assert (r.verdict, r.exit_code, r.jobset_restarts) == ("lost", 1, 1)
    assert "JobSet restarted" in r.why
    # Restarts from before the drill do not count.
    assert judge(Start(**{**START.__dict__, "jobset_restarts": 3}), RECORDED, T0 + 5.2, 3).verdict == "held"


def test_progress_seen_in_status_counts_when_no_hold_names_it() -> None:
    # The trainer died without holding: the coordinator's status had seen step 70.
    crash = [
        {"last_step": 70, "generation": 1},
        ev(0.5, "TrainerDetached", "trainer detached; hold generation 2", "holding", 2, [0, 1, 2, 3]),
        ev(
            9.0,
            "TrainerResumed",
            "trainer resumed at step 50 on slices [0,2,3] from checkpoint",
            "running",
            2,
            [0, 2, 3],
        ),
    ]
    r = judge(START, crash, None, 0)
    assert r.lost_steps == 20 and r.verdict == "lost" and r.phases["held_seconds"] is None
    # A reading of a later generation (taken after the resume, whatever order it arrived in) is
    # progress made since, not a step lost.
    late = [*RECORDED[:3], {"last_step": 63, "generation": 2}, *RECORDED[3:]]
    assert judge(START, late, T0 + 5.2, 0).lost_steps == 0


def test_without_grow_back_or_replacement_it_is_incomplete() -> None:
    r = judge(START, RECORDED[:5], T0 + 5.2, 0)
    assert (r.verdict, r.exit_code) == ("incomplete", 1)
    assert r.phases["grown_back_seconds"] is None and "grown back" in r.why
    r = judge(START, RECORDED, None, 0)
    assert r.verdict == "incomplete" and "replacement running" in r.why


def test_decisions_before_the_loss_or_without_a_recovery_detect_nothing() -> None:
    quiet = [RECORDED[0], ev(0.5, "TrainerFlushed", "trainer committed step 100", "running", 1, [0, 1, 2, 3])]
    r = judge(START, quiet, None, 0)
    assert r.phases["detected_seconds"] is None and r.lost_steps is None
    assert r.verdict == "incomplete" and "no decision" in r.why
    # An old hold of the same generation replayed from a backlog is before the deletion.
    old = [ev(-30.0, "WorkerLost", "host 2.0 lost", "holding", 1, [0, 1, 2, 3])]
    assert judge(START, old, None, 0).phases["detected_seconds"] is None


def test_a_failed_job_is_lost() -> None:
    failed = [*RECORDED[:2], ev(0.3, "Tick", "too few slices: 1 of 4 up (minimum 2)", "failed", 2, [])]
    r = judge(START, failed, None, 0)
    assert r.verdict == "lost" and "too few slices" in r.why


def test_reads_the_decision_cores_own_reasons() -> None:
    """A loss, a shrink and a grow through the real ``decide``, recorded as the coordinator records
    its decisions: the drill finds every phase in them (a reworded reason fails here)."""
    now, state = T0 - 10, initial_state(Policy(num_slices=3, elastic_min_slice_count=2, settle_seconds=0.0), T0 - 10)
    records: list[dict[str, Any]] = []

    def feed(event: Any, t: float) -> Any:
        nonlocal state
        d = decide(state, event, t)
        state = d.state
        records.append(
            {
                "time_unix": t,
                "trigger": type(event).__name__,
                "reason": d.reason,
                "phase": str(d.state.phase),
                "generation": d.state.generation,
                "active_slices": sorted(d.state.active),
            }
        )
        return d

    for s in range(3):
        d = feed(WorkerJoined(s, 0, f"a{s}"), now)
    d = feed(TrainerAttached(0, -1), now)
    (resume,) = [a for a in d.actions if isinstance(a, ResumeTrainer)]
    feed(TrainerResumed(resume.generation, 0, resume.active, "checkpoint"), now)
    feed(TrainerStepped(40, resume.generation), now + 1)
    start = Start(1, T0, state.generation, tuple(sorted(state.active)), 40, 0)
    d = feed(WorkerLost(1, 0, "a1", "stream_closed"), T0 + 0.1)
    (hold,) = [a for a in d.actions if isinstance(a, HoldTrainer)]
    d = feed(TrainerHeld(hold.generation, 41, 40), T0 + 0.3)
    (resume,) = [a for a in d.actions if isinstance(a, ResumeTrainer)]
    assert 1 not in resume.active
    feed(TrainerResumed(resume.generation, 41, resume.active, str(resume.source)), T0 + 0.4)
    # The grow starts when the replacement's host has settled: on its join or on a later tick.
    d = feed(WorkerJoined(1, 0, "b1"), T0 + 5.0)
    holds = [a for a in d.actions if isinstance(a, HoldTrainer)]
    for i in range(4):
        if not holds:
            holds = [a for a in feed(Tick(), T0 + 5.5 + 0.2 * i).actions if isinstance(a, HoldTrainer)]
    (hold,) = holds
    d = feed(TrainerHeld(hold.generation, 60, 40), T0 + 6.2)
    (resume,) = [a for a in d.actions if isinstance(a, ResumeTrainer)]
    feed(TrainerResumed(resume.generation, 60, resume.active, str(resume.source)), T0 + 6.3)
    r = judge(start, records, T0 + 4.0, 0)
    assert r.phases == {
        "detected_seconds": 0.1,
        "held_seconds": 0.3,
        "resumed_seconds": 0.4,
        "replacement_running_seconds": 4.0,
        "grown_back_seconds": 6.3,
    }, records
    assert (r.verdict, r.lost_steps, r.restored_from) == ("held", 0, "memory")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--jobset", "j", "--slice", "-1"], "-1"),
        (["--jobset", "j", "--slice", "one"], "one"),
        (["--jobset", "j", "--slice", "1", "--timeout", "0"], "0"),
        (["--jobset", "j", "--slice", "1", "--admin-address", "nowhere"], "nowhere"),
        (["--slice", "1"], "--jobset"),
    ],
)
def test_bad_usage_exits_2_naming_the_value(args: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["drill", *args])
    assert e.value.code == C.DRILL_EXIT_USAGE
    assert named in capsys.readouterr().err


def test_an_unreadable_kubeconfig_exits_2_before_anything_is_deleted(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    code = main(
        [
            "drill",
            "--jobset",
            "j",
            "--slice",
            "1",
            "--kubeconfig",
            str(missing),
            "--admin-address",
            "127.0.0.1:1",
            "--timeout",
            "5",
        ]
    )
    assert code == C.DRILL_EXIT_USAGE
    assert str(missing) in capsys.readouterr().err


def test_help_lists_examples_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["drill", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "Exit codes: 0 held" in out and "elastic-sidecar drill --kubeconfig" in out and "rbac-drill.yaml" in out


def _pod(rjob: str, index: str, *, tpu: bool, phase: str = "Running") -> Any:
    from kubernetes import client

    labels = {C.LABEL_REPLICATED_JOB_NAME: rjob, C.LABEL_JOB_INDEX: "0", C.LABEL_JOB_COMPLETION_INDEX: index}
    limits = {"google.com/tpu": "4"} if tpu else {"cpu": "4"}
    container = client.V1Container(name="c", resources=client.V1ResourceRequirements(limits=limits))
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=f"{rjob}-{index}", labels=labels),
        spec=client.V1PodSpec(containers=[container]),
        status=client.V1PodStatus(phase=phase),
    )


def test_choose_pod_prefers_the_tpu_pods_over_a_pathways_head_of_the_same_job_index() -> None:
    pytest.importorskip("kubernetes")
    from argparse import Namespace

    from agent.drill import DrillError, choose_pod

    pods = [_pod("pathways-head", "0", tpu=False), _pod("worker", "0", tpu=True), _pod("worker", "1", tpu=True)]
    ns = Namespace(slice=0, jobset="j", host=1, replicated_job=None)
    assert choose_pod(pods, ns, "default").metadata.name == "worker-1"
    with pytest.raises(DrillError, match="--host 5: .*found 0, 1"):
        choose_pod(pods, Namespace(slice=0, jobset="j", host=5, replicated_job=None), "default")
    with pytest.raises(DrillError, match="no running pod"):
        choose_pod([_pod("worker", "0", tpu=True, phase="Pending")], ns, "default")


def test_without_the_kubernetes_package_it_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import kubernetes -> ModuleNotFoundError
    code = main(["drill", "--jobset", "j", "--slice", "1", "--admin-address", "127.0.0.1:1", "--timeout", "5"])
    assert code == C.DRILL_EXIT_USAGE
    assert "elastic-sidecar[drill]" in capsys.readouterr().err
