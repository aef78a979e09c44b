"""Goodput's arithmetic over measured recovery rows, its schedule checks and the published-rate projection."""

from __future__ import annotations

from typing import Any

import pytest

from bench import goodput


def rec(
    strategy: str, fault: str, cost: float | None, step_s: float, own: float | None = None, **kw: Any
) -> dict[str, Any]:
    return {
        "trainer": "example",
        "strategy": strategy,
        "fault": fault,
        "checkpoint_period": 50,
        "replacement_delay": 10.0,
        "runs": 5,
        "fault_free_seconds_per_step": step_s,
        "fault_cost_seconds_median": cost,
        "fault_cost_own_rate_seconds_median": own,
        **kw,
    }


def test_goodput_combines_steady_overhead_and_mixed_fault_costs() -> None:
    rows = [
        rec("full_restart", "kill", 30.0, 0.10),
        rec("full_restart", "hang", 36.0, 0.10),
        rec("full_restart", "notice", 30.0, 0.10, ran_as="kill"),
        rec("sidecar", "kill", 8.0, 0.12, own=6.0),  # its own pre-fault rate is preferred
        rec("sidecar", "hang", 9.0, 0.12),
        rec("sidecar", "notice", 3.0, 0.12),
    ]
    sched = goodput.Schedule(run_hours=10, fault_interval_minutes=10)
    out, proj = goodput.compute(rows, sched)
    by = {r["strategy"]: r for r in out}
    fr, sc = by["full_restart"], by["sidecar"]
    assert fr["ideal_seconds_per_step"] == sc["ideal_seconds_per_step"] == 0.1
    assert fr["mean_fault_cost_seconds"] == pytest.approx(32.0)
    assert fr["goodput"] == pytest.approx(1 - 32.0 / 600, abs=1e-4)
    assert sc["mean_fault_cost_seconds"] == pytest.approx(6.0)  # (6 + 9 + 3) / 3
    assert sc["fault_cost_basis"]["kill"] == "own pre-fault rate"
    assert sc["fault_cost_basis"]["hang"] == "fault-free runs' rate"
    assert sc["steady_overhead"] == pytest.approx(0.2)
    assert sc["goodput"] == pytest.approx((1 - 6.0 / 600) * 0.1 / 0.12, abs=1e-4)
    assert fr["faults_in_run"] == 60 and fr["runs"] == 5
    # Rarer faults: the steady overhead dominates and the ranking flips; the projection says so too.
    rare, _ = goodput.compute(rows, goodput.Schedule(run_hours=10, fault_interval_minutes=600))
    assert {r["strategy"]: r["goodput"] for r in rare}["full_restart"] > {r["strategy"]: r["goodput"] for r in rare}[
        "sidecar"
    ]
    assert {p["strategy"] for p in proj} == {"full_restart", "sidecar"}
    assert all(p["chips"] == goodput.PROJECTION_CHIPS for p in proj)


def test_maxtext_rows_give_their_steady_step_and_their_full_slice_rate_local_cost() -> None:
    def mx(strategy: str, local: float, full: float, steady: float, fault_free: float) -> dict[str, Any]:
        return rec(
            strategy,
            "kill",
            local,
            fault_free,
            trainer="maxtext",
            fault_cost_method="local",
            fault_cost_if_shrunk_steps_took_full_time_seconds_median=full,
            steady_step_seconds_median=steady,
        )

    # The fault-free runs (one each, disturbed) say otherwise; the steady step times before the faults decide.
    rows = [mx("checkpoint_rewind", 20.0, 30.0, 0.030, 0.050), mx("sidecar", 5.0, 8.0, 0.0306, 0.040)]
    out, _ = goodput.compute(rows, goodput.Schedule(run_hours=10, fault_interval_minutes=10, fault_mix={"kill": 1}))
    by = {r["strategy"]: r for r in out}
    assert by["sidecar"]["steady_seconds_per_step"] == pytest.approx(0.0306)
    assert by["sidecar"]["ideal_seconds_per_step"] == pytest.approx(0.030)
    assert by["sidecar"]["fault_cost_seconds"] == {"kill": 8.0}
    assert "full-slice rate" in by["sidecar"]["fault_cost_basis"]["kill"]
    assert by["sidecar"]["goodput"] == pytest.approx((1 - 8.0 / 600) * 0.030 / 0.0306, abs=1e-4)
    assert by["checkpoint_rewind"]["goodput"] == pytest.approx(1 - 30.0 / 600, abs=1e-4)
    # Without the full-rate figure, the local cost itself, named as such.
    plain = {k: v for k, v in rows[1].items() if k != "fault_cost_if_shrunk_steps_took_full_time_seconds_median"}
    assert goodput.fault_cost_of(plain) == (5.0, "own pre-fault step time")


def test_a_period_whose_step_times_drifted_below_plain_maxtext_gets_no_goodput() -> None:
    """A strategy measured faster than plain MaxText by more than the 2% resolved measures the machine's
    drift: the ideal step would be that drift's, so none of that period's rows is ranked."""

    def mx(strategy: str, overhead: float, period: int) -> dict[str, Any]:
        return rec(
            strategy,
            "kill",
            5.0,
            0.03,
            trainer="maxtext",
            checkpoint_period=period,
            fault_cost_method="local",
            steady_step_seconds_median=0.03 * (1 + overhead),
            step_overhead_fraction_median=overhead,
        )

    rows = [mx("full_restart", 0.0, 1000), mx("checkpoint_rewind", -0.197, 1000), mx("sidecar", -0.015, 1000)]
    rows += [mx("full_restart", 0.0, 10000), mx("sidecar", -0.015, 10000)]  # within the resolution: ranked
    out, proj = goodput.compute(rows, goodput.Schedule(fault_mix={"kill": 1}))
    at = {(r["checkpoint_period"], r["strategy"]): r for r in out}
    for s in ("full_restart", "checkpoint_rewind", "sidecar"):
        r = at[(1000, s)]
        assert r["goodput"] is None and "checkpoint_rewind -19.70%" in r["invalid_reason"], r
        assert "sidecar" not in r["invalid_reason"]  # -1.5% is within what the rows resolve
    assert at[(10000, "sidecar")]["goodput"] is not None and "invalid_reason" not in at[(10000, "sidecar")]
    assert {p["checkpoint_period"] for p in proj} == {10000}


def test_maxtexts_rewind_reading_slower_than_plain_maxtext_by_more_than_2_percent_is_drift() -> None:
    """MaxText's rewind does plain MaxText's work a step (its elastic mode reads which slices are up), so a
    reading more than 2% above plain's is the machine's drift too; other strategies may really be slower."""

    def mx(strategy: str, overhead: float, trainer: str = "maxtext") -> dict[str, Any]:
        return rec(
            strategy,
            "kill",
            5.0,
            0.03,
            trainer=trainer,
            checkpoint_period=1000,
            fault_cost_method="local",
            steady_step_seconds_median=0.03 * (1 + overhead),
            step_overhead_fraction_median=overhead,
        )

    rows = [mx("full_restart", 0.0), mx("checkpoint_rewind", 0.0475), mx("sidecar", 0.0532)]
    out, _ = goodput.compute(rows, goodput.Schedule(fault_mix={"kill": 1}))
    for r in out:
        assert r["goodput"] is None and "checkpoint_rewind +4.75% against plain MaxText, though" in r["invalid_reason"]
        assert "sidecar" not in r["invalid_reason"]  # a strategy that adds work may be that much slower
    # Within the resolution, or another strategy that slow: ranked.
    for slow in ([mx("checkpoint_rewind", 0.019), mx("sidecar", 0.0532)], [mx("local_checkpoint_rewind", 0.5)]):
        out, _ = goodput.compute([mx("full_restart", 0.0), *slow], goodput.Schedule(fault_mix={"kill": 1}))
        assert all(r["goodput"] is not None for r in out), out
    # The example trainer's rewind is its own code: the rule is MaxText's.
    rows = [mx("full_restart", 0.0, "example"), mx("checkpoint_rewind", 0.0475, "example")]
    out, _ = goodput.compute(rows, goodput.Schedule(fault_mix={"kill": 1}))
    assert all(r["goodput"] is not None for r in out), out


def test_a_mix_is_weighted_and_unmeasured_kinds_are_named() -> None:
    rows = [rec("sidecar", "kill", 4.0, 0.1), rec("sidecar", "hang", None, 0.1)]
    sched = goodput.Schedule(fault_interval_minutes=1, fault_mix={"kill": 3, "hang": 1, "notice": 1})
    (row,), _ = goodput.compute(rows, sched)
    assert row["faults_measured"] == ["kill"] and row["faults_not_measured"] == ["hang", "notice"]
    assert row["goodput"] == pytest.approx(1 - 4.0 / 60, abs=1e-4)
    # A fault cost beyond the interval keeps nothing (never a negative goodput).
    (row,), _ = goodput.compute([rec("sidecar", "kill", 90.0, 0.1)], sched)
    assert row["goodput"] == 0.0
    # No fault-free rate: no goodput, and the row says why.
    out, _ = goodput.compute([rec("sidecar", "kill", 4.0, 0.1), rec("other", "kill", 4.0, None)], sched)
    other = next(r for r in out if r["strategy"] == "other")
    assert other["goodput"] is None and other["invalid_reason"] == "no fault-free rate"


def test_invalid_rows_do_not_feed_it() -> None:
    rows = [rec("sidecar", "kill", 4.0, 0.1), rec("full_restart", "kill", 1.0, 0.05, invalid_reason="x")]
    out, _ = goodput.compute(rows, goodput.Schedule())
    assert [r["strategy"] for r in out] == ["sidecar"] and out[0]["ideal_seconds_per_step"] == 0.1


def test_the_llama3_rate_gives_about_five_hours_between_interruptions_at_10000_chips() -> None:
    (llama,) = goodput.PUBLISHED_RATES
    assert llama.interval_hours(10_000) == pytest.approx(54 * 24 / (419 * 10_000 / 16_384))
    assert 5.0 < llama.interval_hours(10_000) < 5.1


@pytest.mark.parametrize(
    "mix, why",
    [("kill=1,crash=2", "crash"), ("kill=x", "kill=x")],
)
def test_bad_schedules_are_refused_naming_the_value(mix: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        goodput.Schedule(fault_mix=goodput.parse_mix(mix)).check()
    with pytest.raises(ValueError, match="fault_interval_minutes 0"):
        goodput.Schedule(fault_interval_minutes=0).check()


def test_each_period_at_the_realistic_delay_gets_its_own_rows() -> None:
    result = {
        "config": {"realistic_checkpoint_period": 50, "realistic_delay": 10.0},
        "results": [
            rec("sidecar", "kill", 4.0, 0.1),
            {**rec("sidecar", "kill", 99.0, 0.1), "checkpoint_period": 20},
            {**rec("sidecar", "kill", 7.0, 0.1), "replacement_delay": 30.0},
        ],
    }
    inputs = goodput.realistic_rows(result)
    assert sorted(r["fault_cost_seconds_median"] for r in inputs) == [4.0, 99.0]
    out, proj = goodput.compute(inputs, goodput.Schedule(fault_mix={"kill": 1}))
    assert [(r["checkpoint_period"], r["mean_fault_cost_seconds"]) for r in out] == [(20, 99.0), (50, 4.0)]
    assert {p["checkpoint_period"] for p in proj} == {20, 50}


def test_a_row_invalid_only_against_the_reference_rate_counts_on_its_own_rate() -> None:
    bad = "fault cost below zero in 1 of 5 runs (lowest -0.673 s): the reference rate's noise"
    row = rec("checkpoint_rewind", "kill", 11.5, 0.1, own=13.7, fault_cost_own_rate_runs=5, invalid_reason=bad)
    key = ("trainer", "strategy", "fault", "checkpoint_period", "replacement_delay")
    runs = [{**{k: row[k] for k in key}, "fault_cost_own_rate_s": c} for c in (8.6, 13.7, 5.5, 15.7, 19.7)]
    result = {"config": {"realistic_checkpoint_period": 50, "realistic_delay": 10.0}, "results": [row], "runs": runs}
    (kept,) = goodput.realistic_rows(result)
    assert "invalid_reason" not in kept and kept["reference_note"] == bad
    (out,), _ = goodput.compute([kept], goodput.Schedule(fault_mix={"kill": 1}))
    assert out["mean_fault_cost_seconds"] == 13.7 and bad in out["fault_cost_basis"]["kill"]
    # A run without an own-rate cost, or one below zero, leaves the row invalid.
    for broken in (runs[1:], [{**runs[0], "fault_cost_own_rate_s": -0.1}] + runs[1:]):
        (still,) = goodput.realistic_rows({**result, "runs": broken})
        assert still["invalid_reason"] == bad
        assert goodput.compute([still], goodput.Schedule(fault_mix={"kill": 1}))[0] == []


def test_a_row_valid_against_the_reference_rate_with_an_own_rate_cost_below_zero_counts_at_the_reference() -> None:
    # A sidecar row whose pre-fault windows held auto's probe: one run's own-rate cost reads below zero.
    row = rec("sidecar", "kill", 5.28, 0.1, own=1.63, fault_cost_own_rate_runs=5)
    key = ("trainer", "strategy", "fault", "checkpoint_period", "replacement_delay")
    runs = [{**{k: row[k] for k in key}, "fault_cost_own_rate_s": c} for c in (6.21, 1.63, -0.41, 5.52, 0.51)]
    result = {"config": {"realistic_checkpoint_period": 50, "realistic_delay": 10.0}, "results": [row], "runs": runs}
    (kept,) = goodput.realistic_rows(result)
    assert "fault_cost_own_rate_seconds_median" not in kept and "below zero" in kept["own_rate_note"]
    (out,), _ = goodput.compute([kept], goodput.Schedule(fault_mix={"kill": 1}))
    assert out["mean_fault_cost_seconds"] == 5.28
    assert (
        "fault-free runs' rate" in out["fault_cost_basis"]["kill"] and "below zero" in out["fault_cost_basis"]["kill"]
    )
    # Every own-rate cost at or above zero: the own rate stands.
    fine = [{**r, "fault_cost_own_rate_s": abs(r["fault_cost_own_rate_s"])} for r in runs]
    (own,) = goodput.realistic_rows({**result, "runs": fine})
    assert own["fault_cost_own_rate_seconds_median"] == 1.63 and "own_rate_note" not in own


def test_the_page_leads_with_goodput_from_data_only(tmp_path: Any) -> None:
    import copy

    from bench.report import make_plots, render, sections, targets
    from tests.bench.test_report import fixture

    data = fixture()
    md = render(data)
    assert md.index("## Goodput") < md.index("## Targets") < md.index("## Recovery")
    assert "Llama 3" in md and "hours between interruptions" in md
    v = next(v for v in targets(sections(data)) if v.target.startswith("goodput, example trainer, checkpoint period"))
    assert v.verdict == "not met" and "full_restart higher" in v.basis  # the fixture's sidecar is slower a step
    better = copy.deepcopy(data)
    side = next(r for r in better["benchmarks"]["goodput"]["results"] if r["strategy"] == "sidecar")
    side["goodput"] = 0.999
    name = "goodput, example trainer, checkpoint period 100"
    assert next(v for v in targets(sections(better)) if v.target == name).verdict == "met"
    assert "| example | 100 | sidecar |" in md  # each row names its checkpoint period
    # A group with no goodput at all (every row invalid) is a verdict of its own, giving the rows' reason.
    for r in better["benchmarks"]["goodput"]["results"]:
        r.update(goodput=None, invalid_reason="steady step times drifted: checkpoint_rewind -19.70%")
    v = next(v for v in targets(sections(better)) if v.target == name)
    assert v.verdict == "not measured" and "drifted" in v.basis, v
    assert "goodput" in make_plots(sections(data), tmp_path) and (tmp_path / "goodput.png").exists()
    # No goodput in the file: no section and no figure for it.
    del data["benchmarks"]["goodput"]
    assert "## Goodput" not in render(data)


def test_goodput_reads_a_recovery_result_or_the_recovery_section_of_a_combined_file() -> None:
    from bench.__main__ import recovery_of

    one = {"name": "recovery", "results": [{"trainer": "maxtext"}], "config": {}}
    assert recovery_of(one) is one
    combined = {"benchmarks": {"recovery": one, "flush": {"name": "flush"}}}
    assert recovery_of(combined) == one
    with pytest.raises(ValueError, match=r"no recovery section.*'flush'"):
        recovery_of({"benchmarks": {"flush": {"name": "flush"}}})
    with pytest.raises(ValueError, match="not a recovery result: name 'flush'"):
        recovery_of({"name": "flush", "results": []})


def test_a_cost_below_the_runs_own_stall_is_no_basis_for_the_verdicts_or_goodput() -> None:
    # A recorded sidecar row (kill, period 50, delay 10 s): each run's stall (fault to its first new step)
    # and its cost against its own pre-fault rate and against the fault-free runs' rate.
    from bench.common import cost_below_stall, own_rate_invalid
    from bench.report import sections, targets
    from tests.bench.test_report import fixture

    stall = (4.731, 3.650, 3.938, 3.577, 3.987)
    own = (5.839, 0.829, 0.999, 1.480, 0.511)
    ref = (3.227, 4.914, 4.323, 3.753, 5.943)
    row = rec("sidecar", "kill", 4.323, 0.087, own=0.999, fault_cost_own_rate_runs=5)
    key = ("trainer", "strategy", "fault", "checkpoint_period", "replacement_delay")
    runs = [
        {
            **{k: row[k] for k in key},
            "recovery_s": s,
            "pre_fault_seconds_per_step": 0.1,
            "fault_cost_own_rate_s": o,
            "fault_cost_s": f,
        }
        for s, o, f in zip(stall, own, ref, strict=True)
    ]
    result = {"config": {"realistic_checkpoint_period": 50, "realistic_delay": 10.0}, "results": [row], "runs": runs}
    why = own_rate_invalid(result, row)
    assert why is not None and "own pre-fault rate below the run's own stall in 4 of 5 runs" in why
    assert "worst 0.511 s against 3.887 s" in why
    ref_why = cost_below_stall(result, row, own_rate=False)
    assert ref_why is not None and "fault-free runs' rate below the run's own stall in 1 of 5 runs" in ref_why
    (kept,) = goodput.realistic_rows(result)
    assert kept["basis_invalid"] == ref_why
    (out,), _ = goodput.compute([kept], goodput.Schedule(fault_mix={"kill": 1}))
    assert out["goodput"] is None and out["invalid_reason"] == ref_why
    from bench.report import _goodput_targets

    other = {**out, "strategy": "checkpoint_rewind", "goodput": 0.97, "invalid_reason": None}
    (verdict,) = _goodput_targets({"results": [out, other], "runs": 5})
    assert verdict.verdict == "not measured" and verdict.basis == ref_why
    # Every cost at or above its stall less a step: both bases stand, and the own rate is used.
    fine = [{**r, "fault_cost_own_rate_s": r["recovery_s"], "fault_cost_s": r["recovery_s"] - 0.08} for r in runs]
    assert own_rate_invalid({**result, "runs": fine}, row) is None
    assert cost_below_stall({**result, "runs": fine}, row, own_rate=False) is None
    (ok,) = goodput.realistic_rows({**result, "runs": fine})
    assert "basis_invalid" not in ok and ok["fault_cost_own_rate_seconds_median"] == 0.999
    # Steps computed again may run up to STALL_RATE_SLACK faster than the rate: 10 of them at 0.1 s, 0.1 s.
    redo = [{**r, "lost_steps": 10, "fault_cost_own_rate_s": r["recovery_s"] - 0.15} for r in runs]
    assert own_rate_invalid({**result, "runs": redo}, row) is None
    redo = [{**r, "fault_cost_own_rate_s": r["recovery_s"] - 0.25} for r in redo]
    assert "in 5 of 5 runs" in (own_rate_invalid({**result, "runs": redo}, row) or "")
    # MaxText's local costs are not judged this way.
    assert cost_below_stall(result, {**row, "fault_cost_method": "local"}, own_rate=True) is None

    # The page: the example trainer's ratio verdicts are not measured on either basis.
    data = fixture()
    rows = {r["strategy"]: r for r in data["benchmarks"]["recovery"]["results"] if r["trainer"] == "example"}
    sidecar = rows["sidecar"]
    sidecar.update(
        fault_cost_own_rate_seconds_median=0.999,
        fault_cost_own_rate_runs=sidecar["runs"],
        fault_free_seconds_per_step=0.1,
    )
    data["benchmarks"]["recovery"]["runs"] = [
        {
            "trainer": "example",
            "strategy": "sidecar",
            **{k: sidecar[k] for k in ("fault", "checkpoint_period", "replacement_delay")},
            "recovery_s": stall[i % 5],
            "pre_fault_seconds_per_step": 0.1,
            "fault_cost_own_rate_s": own[i % 5],
            "fault_cost_s": 0.0,
        }
        for i in range(sidecar["runs"])
    ]
    vs = {v.target: v for v in targets(sections(data))}
    rewind = vs["sidecar vs checkpoint rewind, example trainer (kill)"]
    assert rewind.verdict == "not measured" and "below the run's own stall" in rewind.basis
