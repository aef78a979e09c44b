"""The MaxText recovery benchmark's arithmetic, without running MaxText: fault phases, one run's
figures from its event log, rows from recorded runs, and which rows say they were not run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import recovery_maxtext
from bench.recovery_maxtext import (
    Job,
    analyse,
    fault_index,
    maxtext_flags,
    recovery_phases,
    snapshot_cost,
    summarise,
)


def test_fault_phases_are_seeded_and_cover_the_checkpoint_period() -> None:
    for period in (5, 20, 100, 4000):
        job = Job("tiny", period)
        at = [fault_index(job, 0, rep) for rep in range(30)]
        assert at == [fault_index(job, 0, rep) for rep in range(30)]
        first = job.first_period_end
        assert first % period == 0 and first - job.start_label == job.lead >= min(period, recovery_maxtext.LEAD_STEPS)
        assert job.start_label > 0, "every run restores a pre-trained checkpoint"
        assert all(first < a <= first + period for a in at), at
        assert len({a - first for a in at}) > min(3, period - 1), "phases vary"
        for s in recovery_maxtext.STRATEGIES:
            assert all(a + recovery_maxtext.TAIL_STEPS <= job.steps_for(a, s) for a in at), "it runs on after the fault"
    assert [fault_index(Job("tiny", 100), 1, r) for r in range(20)] != [
        fault_index(Job("tiny", 100), 0, r) for r in range(20)
    ]
    with pytest.raises(ValueError, match="checkpoint_period=0"):
        Job("tiny", 0)
    with pytest.raises(ValueError, match="runs=0"):
        fault_index(Job("tiny", 100), 0, 0, 0)


def test_the_rounds_fault_phases_are_stratified_over_the_period() -> None:
    job = Job("tiny", 1000)
    for seed in range(20):
        phases = [fault_index(job, seed, rep, 5) - job.first_period_end - 1 for rep in range(5)]
        assert [ph // 200 for ph in phases] == [0, 1, 2, 3, 4], phases  # one in each fifth, in round order
        assert sorted(phases)[2] in range(400, 600), "the median phase is mid-period"
    # Seeded: the same rounds draw the same phases; another seed draws others.
    assert [fault_index(job, 3, r, 5) for r in range(5)] == [fault_index(job, 3, r, 5) for r in range(5)]
    assert [fault_index(job, 3, r, 5) for r in range(5)] != [fault_index(job, 4, r, 5) for r in range(5)]


def test_a_run_that_starts_from_the_pre_trained_checkpoint_counts_from_its_own_first_step() -> None:
    # Restored at label 100 (101 steps completed): the run's steps are 102.., its warm-up ends at 104.
    ev = [*steps(102, 160, 0.0), {"kind": "fault", "step": 160, "t": 5.95}, *steps(151, 200, 10.0)]
    m = analyse(ev, steps=200, fault_step=160, reference_steps=300)
    assert "error" not in m, m
    assert m["lost_steps"] == 10 and m["restored_step"] == 150
    assert m["own_step_reference_steps"] == 160 - 104, "the step time is measured past the run's own warm-up"
    assert m["work_steps"] == 200 - 104
    assert "no step 3 (the end of the warm-up)" in analyse([], steps=200, fault_step=160)["error"]


def test_only_the_baseline_without_elastic_restarts_the_process() -> None:
    assert not any(f.startswith("elastic_enabled") for f in maxtext_flags(Job("tiny", 20), "full_restart", 5.0))
    for s in ("checkpoint_rewind", "sidecar"):
        flags = maxtext_flags(Job("tiny", 20), s, 30.0)
        assert "elastic_enabled=true" in flags and "checkpoint_period=20" in flags
        timeout = int(next(f for f in flags if f.startswith("elastic_timeout_seconds=")).split("=")[1])
        assert timeout > 30.0 + 10.0, "the attempt outlives the replacement delay and pathwaysutils' 10 s poll"
    with pytest.raises(ValueError, match="'memory_snapshot'"):
        maxtext_flags(Job("tiny", 20), "memory_snapshot", 1.0)


def test_the_local_checkpoint_rewind_is_the_rewind_with_a_frequent_checkpoint_in_place_of_the_periodic_one() -> None:
    job = Job("tiny", 300, local_checkpoint_period=7)
    local, rewind = maxtext_flags(job, "local_checkpoint_rewind", 10.0), maxtext_flags(job, "checkpoint_rewind", 10.0)
    assert "checkpoint_period=7" in local and "checkpoint_period=300" not in local
    assert [f for f in local if not f.startswith("checkpoint_period=")] == [
        f for f in rewind if not f.startswith("checkpoint_period=")
    ]
    assert (
        Job("tiny", 300).local_checkpoint_period == 20 == recovery_maxtext.LOCAL_CHECKPOINT_PERIOD
    )  # MaxText's example
    with pytest.raises(ValueError, match="local_checkpoint_period=0"):
        Job("tiny", 300, local_checkpoint_period=0)


def test_min_slices_goes_to_both_elastic_strategies_with_room_for_the_scale_up_attempt() -> None:
    for s in ("checkpoint_rewind", "sidecar"):
        assert {"elastic_min_slice_count=-1", "elastic_max_retries=3"} <= set(maxtext_flags(Job("tiny", 20), s, 5.0))
        flags = set(maxtext_flags(Job("tiny", 20, min_slices=1), s, 5.0))
        assert {"elastic_min_slice_count=1", "elastic_max_retries=5"} <= flags, flags
    assert not any("min_slice" in f for f in maxtext_flags(Job("tiny", 20, min_slices=1), "full_restart", 5.0))
    for bad in (0, recovery_maxtext.SLICES + 1, -2):
        with pytest.raises(ValueError, match=f"min_slices={bad}"):
            Job("tiny", 20, min_slices=bad)


def steps(first: int, last: int, t0: float, dt: float = 0.1, **kw: Any) -> list[dict[str, Any]]:
    return [{"kind": "step", "step": s, "t": t0 + (i + 1) * dt, **kw} for i, s in enumerate(range(first, last + 1))]


def test_a_shrink_and_a_scale_up_that_both_rewind_count_every_step_run_again_and_weigh_the_shrunk_steps() -> None:
    # Four devices to step 25; lost in index 25; on two devices from the checkpoint at 20 (steps 21..32, 0.05 s
    # each); the scale-up rewinds to 20 again and runs 21..40 on four devices.
    ev = [
        *steps(1, 25, 0.0, devices=4, pid=1),
        {"kind": "fault", "step": 25, "t": 2.55},
        *steps(21, 32, 5.0, dt=0.05, devices=2, pid=1),
        *steps(21, 40, 9.0, devices=4, pid=1),
    ]
    m = analyse(ev, steps=40, fault_step=25, replacement_time=6.0)
    assert "error" not in m, m
    assert m["lost_steps"] == 5 + 12 and m["rewinds"] == 2
    assert m["restored_step"] == 20 and m["shrunk_steps"] == 0  # every shrunk step was run again in full
    assert m["work_steps"] == 37
    # The same, but the scale-up restores a snapshot at 32 (the sidecar): the shrunk steps 26..32 are kept.
    ev = [*ev[:26], *steps(21, 32, 5.0, dt=0.05, devices=2, pid=1), *steps(33, 40, 9.0, devices=4, pid=1)]
    m = analyse(ev, steps=40, fault_step=25)
    assert m["lost_steps"] == 5 and m["rewinds"] == 1
    assert m["shrunk_steps"] == 12  # 21..32 on two devices, kept
    assert m["work_steps"] == pytest.approx(37 - 12 * 0.5)


def test_a_row_gives_the_median_of_its_runs_shrunk_steps_and_its_min_slices() -> None:
    runs = [
        faulted("sidecar", fault_cost_s=3.5, shrunk_steps=10),
        faulted("sidecar", fault_cost_s=4.5, shrunk_steps=12),
    ]
    row = summarise("sidecar", "kill", 20, 1.0, "tiny", runs, min_slices=1)
    assert row["elastic_min_slice_count"] == 1
    assert row["fault_cost_seconds_median"] == pytest.approx(4.0) and row["shrunk_steps_median"] == 11


def test_a_rewind_counts_the_steps_run_again_and_the_time_to_the_next_new_step() -> None:
    # 25 steps at 0.1 s (t 0.1 .. 2.5); the slice is lost in step index 25 at t 2.55; the replacement at 3.55;
    # the next attempt restores 20 completed steps and runs 21.. from t 10.0 (0.1 s each) to 40.
    ev = [*steps(1, 25, 0.0), {"kind": "fault", "step": 25, "t": 2.55}, *steps(21, 40, 10.0)]
    m = analyse(ev, steps=40, fault_step=25, replacement_time=3.55)
    assert "error" not in m, m
    assert (m["step_at_fault"], m["restored_step"], m["lost_steps"]) == (25, 20, 5)
    assert m["recovery_s"] == pytest.approx(10.6 - 2.55)  # step 26 completes at 10.0 + 6 * 0.1
    assert m["recovery_after_replacement_s"] == pytest.approx(10.6 - 3.55)
    assert m["replacement_after_s"] == pytest.approx(1.0)
    assert m["work_steps"] == 37  # steps 4..40, each counted once however often it ran


def test_a_snapshot_restore_loses_no_completed_step() -> None:
    ev = [*steps(1, 25, 0.0), {"kind": "fault", "step": 25, "t": 2.55}, *steps(26, 40, 5.0)]
    m = analyse(ev, steps=40, fault_step=25)
    assert (m["restored_step"], m["lost_steps"]) == (25, 0) and m["recovery_s"] == pytest.approx(5.1 - 2.55)
    assert "recovery_after_replacement_s" not in m


@pytest.mark.parametrize(
    ("events", "fault_step", "why"),
    [
        (steps(1, 40, 0.0), 25, "no fault happened"),
        ([*steps(1, 30, 0.0), {"kind": "fault", "step": 30, "t": 3.05}, *steps(31, 40, 5.0)], 25, "expected 25"),
        ([*steps(1, 25, 0.0), {"kind": "fault", "step": 25, "t": 2.55}, *steps(21, 33, 9.0)], 25, "did not finish"),
        (steps(1, 2, 0.0), 25, "warm-up"),
    ],
)
def test_a_run_that_did_not_do_what_it_measures_is_an_error_not_a_figure(
    events: list[dict[str, Any]], fault_step: int, why: str
) -> None:
    m = analyse(events, steps=40, fault_step=fault_step)
    assert why in m.get("error", ""), m
    assert m["lost_steps"] is None and m["recovery_s"] is None


def faulted(strategy: str, **kw: Any) -> dict[str, Any]:
    return {
        "strategy": strategy,
        "fault": "kill",
        "checkpoint_period": 20,
        "replacement_delay": 1.0,
        "fault_step": 30,
        "lost_steps": 0,
        "recovery_s": 4.0,
        "params": 1000,
        **kw,
    }


def test_a_row_gives_the_medians_of_its_runs_and_leaves_out_the_failed_ones() -> None:
    runs = [
        faulted("sidecar", fault_cost_s=3.0, recovery_s=4.0, recovery_after_replacement_s=3.0),
        faulted("sidecar", fault_cost_s=4.0, recovery_s=5.0, recovery_after_replacement_s=4.0),
        faulted("sidecar", fault_cost_s=5.0, recovery_s=6.0, recovery_after_replacement_s=5.0, lost_steps=2),
        faulted("sidecar", fault_cost_s=99.0, recovery_s=99.0, error="training did not finish: last completed step 33"),
    ]
    row = summarise("sidecar", "kill", 20, 1.0, "tiny", runs)
    assert (row["runs"], row["failed_runs"]) == (3, 1)
    assert row["failures"] == ["training did not finish: last completed step 33"]
    assert (row["fault_cost_seconds_median"], row["fault_cost_seconds_max"]) == (4.0, 5.0)
    assert (row["lost_steps_median"], row["lost_steps_max"]) == (0, 2)
    assert row["recovery_seconds_median"] == 5.0 and row["recovery_after_replacement_seconds_median"] == 4.0
    assert row["params"] == 1000 and "invalid_reason" not in row
    assert {"trainer", "strategy", "fault", "replacement_delay", "checkpoint_period", "fault_cost_seconds_p90"} <= set(
        row
    )


def test_a_row_without_a_good_run_is_invalid_and_has_no_figures() -> None:
    bad = [faulted("checkpoint_rewind", error="no fault happened")]
    row = summarise("checkpoint_rewind", "kill", 20, 1.0, "tiny", bad)
    assert row["runs"] == 0 and row["fault_cost_seconds_median"] is None and row["lost_steps_median"] is None
    assert "no fault happened" in row["invalid_reason"]


def test_snapshot_cost_needs_snapshots() -> None:
    assert snapshot_cost({"snapshots": 0, "snapshot_every": 1}) == {}
    assert snapshot_cost(None) == {}
    c = snapshot_cost({"snapshots": 4, "hook_seconds_per_step": 0.00034})
    assert c == {"snapshots": 4, "hook_seconds_per_step": 0.00034}


def test_an_unknown_model_size_strategy_or_fault_is_named() -> None:
    kw: dict[str, Any] = {"runs": 1, "seed": 0, "root": Path("/nonexistent")}
    with pytest.raises(ValueError, match="'huge'"):
        recovery_maxtext.run(strategies=["sidecar"], cases=[], model="huge", **kw)
    with pytest.raises(ValueError, match="memory_snapshot"):
        recovery_maxtext.run(strategies=["sidecar", "memory_snapshot"], cases=[], **kw)
    with pytest.raises(ValueError, match="hang"):
        recovery_maxtext.run(strategies=["sidecar"], cases=[("hang", 20, 1.0)], **kw)


def test_a_run_that_raises_is_a_failed_run_with_the_reason(tmp_path: Path) -> None:
    r = recovery_maxtext.guarded(Job("tiny", 20), "no_such_strategy", tmp_path, "x", fault_step=42, delay=1.0)
    assert r["error"].startswith("ValueError: unknown MaxText strategy 'no_such_strategy'"), r
    assert (r["fault_step"], r["lost_steps"], r["recovery_s"]) == (42, None, None)


def test_without_the_maxtext_venv_every_maxtext_row_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from simjob.maxtext import job

    monkeypatch.setattr(job, "MAXTEXT_PYTHON", tmp_path / "absent" / "python")
    r = recovery_maxtext.run(
        strategies=["full_restart", "sidecar"],
        cases=[("kill", 20, 1.0)],
        runs=3,
        seed=0,
        root=tmp_path,
    )
    rows = {x["strategy"]: x for x in r["rows"]}
    assert all(x["runs"] == 0 and x["status"] == "not_run" for x in rows.values())
    assert "no MaxText interpreter" in rows["sidecar"]["invalid_reason"]
    assert "no MaxText interpreter" in rows["full_restart"]["invalid_reason"]
    assert r["runs"] == []


def test_a_shrunk_run_counts_only_once_it_is_back_on_every_slice_after_the_replacement() -> None:
    before = [*steps(1, 25, 0.0, devices=4, pid=1), {"kind": "fault", "step": 25, "t": 2.55}]
    ended_shrunk = [*before, *steps(26, 40, 5.0, dt=0.05, devices=2, pid=1)]
    m = analyse(ended_shrunk, steps=40, fault_step=25, replacement_time=6.0)
    assert "back on every slice" in m["error"], m
    grown = [*before, *steps(26, 30, 5.0, dt=0.05, devices=2, pid=1), *steps(31, 40, 9.0, devices=4, pid=1)]
    m = analyse(grown, steps=40, fault_step=25, replacement_time=6.0)
    assert "error" not in m, m
    assert m["back_on_every_slice_after_replacement_s"] == pytest.approx(9.1 - 6.0)
    # A job that continues on the survivor runs long enough past its fault to grow back; a full restart,
    # or a job that waits for every slice, does not need to.
    assert Job("tiny", 20, min_slices=1).steps_for(50, "sidecar") == 50 + recovery_maxtext.GROW_TAIL_STEPS
    assert Job("tiny", 20, min_slices=1).steps_for(50, "checkpoint_rewind") == 50 + recovery_maxtext.GROW_TAIL_STEPS
    assert Job("tiny", 20, min_slices=1).steps_for(50, "full_restart") == 50 + recovery_maxtext.TAIL_STEPS
    assert Job("tiny", 20).steps_for(50, "sidecar") == 50 + recovery_maxtext.TAIL_STEPS


def test_the_local_fault_cost_uses_the_runs_own_step_time_over_a_short_window_after_the_fault() -> None:
    # 25 steps at 0.1 s (t 0.1 .. 2.5), the slice lost in index 25; the next attempt restores 20 and runs 21..
    # from t 10.0 at 0.1 s. Window: from step 25 (t 2.5) to 10 new steps past step 26 (the first new one), t 11.6.
    ev = [*steps(1, 25, 0.0), {"kind": "fault", "step": 25, "t": 2.55}, *steps(21, 40, 10.0)]
    m = analyse(ev, steps=40, fault_step=25, reference_steps=20, local_tail=10)
    assert m["own_step_s"] == pytest.approx(0.1) and m["own_step_reference_steps"] == 20
    assert m["local_window_work_steps"] == 11 and m["local_window_tail_steps"] == 10
    # 7.5 s until the restart, 0.5 s running 21..25 again: the work of 26..36 took its own time.
    assert m["fault_cost_s"] == pytest.approx(8.0)
    # A run slower throughout (0.2 s a step before and after) costs the same fault: the rate is its own.
    slow = [*steps(1, 25, 0.0, dt=0.2), {"kind": "fault", "step": 25, "t": 5.05}, *steps(21, 40, 12.5, dt=0.2)]
    assert analyse(slow, steps=40, fault_step=25, reference_steps=20, local_tail=10)["fault_cost_s"] == (
        pytest.approx(7.5 + 1.0)
    )
    # The window is cut at the run's end rather than read past it, and says so.
    m = analyse(ev, steps=40, fault_step=25, reference_steps=20, local_tail=50)
    assert m["local_window_tail_steps"] == 40 - 26
    # Too few steps before the fault for a step time of its own: the run has no fault cost, and says why.
    early = [*steps(1, 8, 0.0), {"kind": "fault", "step": 8, "t": 0.85}, *steps(9, 40, 5.0)]
    m = analyse(early, steps=40, fault_step=8)
    assert "error" not in m and "fault_cost_s" not in m and "too few steps" in m["local_note"], m


def test_the_local_fault_cost_weighs_the_survivors_steps_and_ends_past_the_return_to_every_slice() -> None:
    # Four devices at 0.1 s to step 25; lost in 25; steps 26..30 on two devices (0.05 s) from t 5.0, the
    # snapshot's step boundary kept; back on four devices from step 31 at t 9.1 (replacement at 6.0).
    ev = [
        *steps(1, 25, 0.0, devices=4, pid=1),
        {"kind": "fault", "step": 25, "t": 2.55},
        *steps(26, 30, 5.0, dt=0.05, devices=2, pid=1),
        *steps(31, 40, 9.0, devices=4, pid=1),
    ]
    m = analyse(ev, steps=40, fault_step=25, replacement_time=6.0, reference_steps=20, local_tail=5)
    assert "error" not in m, m
    assert m["local_window_work_steps"] == pytest.approx(5 * 0.5 + 6)  # 26..30 at half, 31..36 whole
    assert m["fault_cost_s"] == pytest.approx((9.6 - 2.5) - 8.5 * 0.1)


def test_the_config_records_the_pre_trained_start_and_the_tail_the_runs_have_on_the_survivor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from simjob.maxtext import job

    monkeypatch.setattr(job, "MAXTEXT_PYTHON", tmp_path / "absent" / "python")
    r = recovery_maxtext.run(
        strategies=["sidecar"], cases=[("kill", 20, 1.0)], runs=1, seed=0, root=tmp_path, min_slices=1
    )
    assert r["config"]["tail_steps"] == recovery_maxtext.GROW_TAIL_STEPS
    assert r["config"]["start_label"] == {20: Job("tiny", 20).start_label}
    assert r["config"]["first_period_end"] == {20: Job("tiny", 20).first_period_end}
    assert recovery_maxtext.run(strategies=["sidecar"], cases=[("kill", 20, 1.0)], runs=1, seed=0, root=tmp_path)[
        "config"
    ]["tail_steps"] == (recovery_maxtext.TAIL_STEPS)


def test_a_period_whose_pre_training_fails_has_rows_that_say_so_and_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from simjob.maxtext import job

    python = tmp_path / "python"
    python.touch()
    monkeypatch.setattr(job, "MAXTEXT_PYTHON", python)
    ran: list[Any] = []

    def pretrain(j: Job, root: Path) -> Path:
        if j.checkpoint_period == 20:
            raise RuntimeError("pre-training committed no checkpoint 20")
        ran.append(("pretrain", j.checkpoint_period))
        return root / "ckpt"

    def guarded(j: Job, strategy: str, root: Path, tag: str, **kw: Any) -> dict[str, Any]:
        ran.append((strategy, j.checkpoint_period, kw["start"]))
        return {"strategy": strategy, "fault_step": kw["fault_step"], "replacement_delay": kw["delay"], "error": "x"}

    monkeypatch.setattr(recovery_maxtext, "pretrain", pretrain)
    monkeypatch.setattr(recovery_maxtext, "guarded", guarded)
    r = recovery_maxtext.run(
        strategies=["sidecar"], cases=[("kill", 20, 1.0), ("kill", 50, 1.0)], runs=1, seed=0, root=tmp_path
    )
    bad = [row for row in r["rows"] if row["checkpoint_period"] == 20]
    assert [row["fault"] for row in bad] == ["kill", "notice"], bad  # the sidecar's notice row beside the kill
    for row in bad:
        assert row["status"] == "not_run"
        assert "pre-training failed: RuntimeError: pre-training committed no" in row["invalid_reason"]
    assert all(x[1] == 50 for x in ran), ran  # nothing ran for the period without a start
    assert ("sidecar", 50, tmp_path / "ckpt") in ran, "every run of a period starts from its pre-trained checkpoint"


def test_the_mesh_slices_are_the_newest_mesh_before_the_fault_and_the_first_attempts_after_it() -> None:
    mesh = [
        {"kind": "mesh", "slices": 4, "t": 0.5},
        *steps(1, 25, 1.0, devices=8, pid=1),
        {"kind": "fault", "step": 25, "t": 3.55},
        {"kind": "mesh", "slices": 3, "t": 4.0},  # the first attempt after the fault
        *steps(25, 30, 5.0, devices=6, pid=1),
        {"kind": "mesh", "slices": 4, "t": 9.0},  # back on every slice: not the first attempt after it
        *steps(31, 40, 9.5, devices=8, pid=1),
    ]
    m = analyse(mesh, steps=40, fault_step=25)
    assert (m["mesh_slices_before"], m["mesh_slices_after"]) == (4, 3), m
    assert recovery_maxtext.mesh_slices([], 1.0) == (None, None)


def test_a_row_gives_its_mesh_slices_as_whole_numbers() -> None:
    runs = [faulted("sidecar", mesh_slices_before=4, mesh_slices_after=3) for _ in range(3)]
    row = summarise("sidecar", "kill", 1000, 1.0, "tiny", runs)
    assert (row["mesh_slices_before"], row["mesh_slices_after"]) == (4, 3)
    assert isinstance(row["mesh_slices_before"], int) and isinstance(row["mesh_slices_after"], int)
    assert summarise("sidecar", "kill", 1000, 1.0, "tiny", [faulted("sidecar")])["mesh_slices_after"] is None


def test_the_job_has_at_least_three_slices_and_the_data_axis_across_them() -> None:
    assert recovery_maxtext.SLICES >= 3 and recovery_maxtext.DEVICES % recovery_maxtext.SLICES == 0
    for s in recovery_maxtext.STRATEGIES:
        flags = maxtext_flags(Job("tiny", 20), s, 5.0)
        assert "dcn_data_parallelism=-1" in flags and not any(f.startswith("ici_data_parallelism") for f in flags)


def test_snapshot_figures_of_the_orbax_snapshotter_hook_reach_the_row() -> None:
    finished = {
        "snapshots": 40,
        "snapshots_skipped": 3,
        "snapshots_failed": 0,
        "snapshot_every": "auto",
        "snapshot_every_now": 5,
        "snapshot_overhead_fraction": 0.0123,
        "hook_seconds_per_step": 0.00034,
    }
    cost = snapshot_cost(finished)
    assert cost == {
        "snapshots": 40,
        "snapshots_skipped": 3,
        "snapshots_failed": 0,
        "snapshot_every": 5,
        "hook_overhead_fraction": 0.0123,
        "hook_seconds_per_step": 0.00034,
    }
    runs = [faulted("sidecar", snapshot=cost), faulted("sidecar", snapshot={**cost, "hook_seconds_per_step": 0.0004})]
    row = summarise("sidecar", "kill", 20, 1.0, "tiny", [*runs, faulted("sidecar", snapshot=cost, error="x")])
    assert row["snapshot_hook_overhead_fraction_median"] == 0.0123 and row["snapshot_every_seen"] == ["5"]
    # The hook's own seconds a step (elastic-sidecar plan's measured input), over the runs without an error.
    assert row["hook_seconds_per_step_median"] == pytest.approx(0.00037) and row["snapshot_cost_runs"] == 2


def phase_events() -> list[dict[str, Any]]:
    """Steps 1-5 on 8 devices, a fault, an attempt on 6 (mesh, restore, first iteration, compile, step),
    steps on 6, then the grow's attempt back on 8."""
    evs: list[dict[str, Any]] = [{"kind": "step", "step": k, "t": float(k), "devices": 8} for k in range(1, 6)]
    evs += [
        {"kind": "fault", "t": 5.5},
        {"kind": "step_failed", "t": 5.8},
        {"kind": "mesh", "t": 7.0},
        {"kind": "restore", "t": 7.5, "seconds": 0.3},
        {"kind": "state", "t": 8.0},
        {"kind": "compile", "t": 8.5, "seconds": 0.6},
        {"kind": "step", "step": 6, "t": 9.0, "devices": 6},
        {"kind": "step", "step": 7, "t": 9.5, "devices": 6},
        {"kind": "mesh", "t": 12.5},
        {"kind": "restore", "t": 13.0, "seconds": 0.2},
        {"kind": "state", "t": 13.2},
        {"kind": "compile", "t": 13.5, "seconds": 0.5},
        {"kind": "step", "step": 8, "t": 14.0, "devices": 8},
    ]
    return evs


def test_a_recovery_splits_into_phases_that_sum_to_the_fault_to_the_first_step_and_the_grows_own() -> None:
    p = recovery_phases(phase_events(), decided=5.6, held=[6.0, 12.0])  # the sidecar's decision and HeldAcks
    assert p == pytest.approx(
        {
            "detect": 0.1,
            "hold": 0.4,
            "rebuild": 2.3,
            "restore": 0.3,
            "first_step": 0.4,
            "degraded": 3.0,
            "grow_rebuild": 1.5,
            "grow_restore": 0.2,
            "grow_first_step": 0.3,
        }
    )
    assert sum(p[k] for k in ("detect", "hold", "rebuild", "restore", "first_step")) == pytest.approx(9.0 - 5.5)
    # Without the sidecar: detected where the error surfaced, held when the next attempt builds its mesh, and
    # the grow starts after the last step on fewer slices.
    q = recovery_phases(phase_events())
    assert (q["detect"], q["hold"], q["rebuild"], q["degraded"]) == pytest.approx((0.3, 1.2, 1.3, 0.5))
    assert recovery_phases([e for e in phase_events() if e["kind"] != "fault"]) == {}


def test_without_the_sidecar_the_rebuild_starts_where_the_next_attempt_starts_re_initialising() -> None:
    # elastic_retry's first attempt, then the one after the fault: its slice check, MaxText's config and mesh
    # are the rebuild's, as they are after the sidecar's HeldAck.
    evs = [{"kind": "attempt", "t": 0.5}, *phase_events(), {"kind": "attempt", "t": 6.4}]
    q = recovery_phases(evs)
    assert (q["detect"], q["hold"], q["rebuild"]) == pytest.approx((0.3, 0.6, 1.9))
    assert sum(q[k] for k in ("detect", "hold", "rebuild", "restore", "first_step")) == pytest.approx(9.0 - 5.5)
    assert recovery_phases(evs, decided=5.6, held=[6.0, 12.0])["rebuild"] == pytest.approx(2.3)  # HeldAck first


def test_a_row_gives_the_median_of_each_phase_and_of_the_bytes_written_to_storage() -> None:
    runs = [
        faulted("sidecar", phases={"detect": 0.1, "rebuild": 2.0}, flush_bytes=0),
        faulted("sidecar", phases={"detect": 0.3, "rebuild": 4.0, "degraded": 1.0}, flush_bytes=0),
        faulted("sidecar", phases={"detect": 0.2, "rebuild": 3.0}, flush_bytes=10),
    ]
    row = summarise("sidecar", "notice", 20, 1.0, "tiny", runs)
    assert row["phase_seconds_median"] == {"detect": 0.2, "rebuild": 3.0, "degraded": 1.0}
    assert row["flush_bytes_median"] == 0
