"""The paired step-overhead benchmark's arithmetic (bench/step_overhead.py) and its verdict on the page."""

from __future__ import annotations

import os
from typing import Any

import pytest

from bench import step_overhead as so
from bench.report import render, sections, targets


def steps(n: int, *, wall: float, cpu: float, steal: float = 0.0, pid: int = 7, first: int = 0) -> list[dict[str, Any]]:
    return [
        {"kind": "step", "pid": pid, "step": first + i, "t": i * wall, "cpu": i * cpu, "steal": i * steal}
        for i in range(n)
    ]


def test_the_steady_window_sums_consecutive_steps_of_one_process_past_its_start() -> None:
    evs = steps(300, wall=0.04, cpu=0.07, steal=0.004)
    w = so.steady_window(evs, from_step=100)
    assert w is not None
    assert w["steps"] == 199
    assert w["wall_s"] == pytest.approx(199 * 0.04)
    assert w["cpu_s"] == pytest.approx(199 * 0.07)
    fig = so.run_figures(w, cpus=2)
    assert fig["wall_step_s"] == pytest.approx(0.04)
    assert fig["steal_fraction"] == pytest.approx(0.004 / (0.04 * 2))
    # A second process (a restart) and a gap in the steps are not one step's time.
    other = steps(300, wall=0.04, cpu=0.07, pid=8, first=300)
    joined = so.steady_window([*evs, *other], from_step=100)
    assert joined is not None and joined["steps"] == 199 + 299


def test_a_run_without_cpu_or_steal_or_with_too_few_steps_has_no_window() -> None:
    evs = steps(300, wall=0.04, cpu=0.07)
    for e in evs:
        e.pop("cpu")
    assert so.steady_window(evs, from_step=100) is None
    assert so.steady_window(steps(100 + so.MIN_STEPS, wall=0.04, cpu=0.07), from_step=100) is None


def fig(wall: float, cpu: float, steal: float = 0.0, **kw: Any) -> dict[str, Any]:
    return {"wall_step_s": wall, "cpu_step_s": cpu, "steal_fraction": steal, **kw}


def test_overheads_are_paired_within_a_round_and_rounds_with_steal_are_left_out() -> None:
    snap = {"snapshot": {"hook_overhead_fraction": 0.01, "snapshot_every": 60, "hook_seconds_per_step": 0.0002}}
    rounds = [
        {"plain": fig(0.040, 0.070), "sidecar": fig(0.0404, 0.0714, **snap)},  # +1%, +2%
        {"plain": fig(0.050, 0.080), "sidecar": fig(0.0515, 0.0808, **snap)},  # +3%, +1%: a slower round, paired
        {"plain": fig(0.030, 0.060, steal=0.2), "sidecar": fig(0.060, 0.061, **snap)},  # steal: left out
        {"plain": fig(0.040, 0.070), "sidecar": fig(0.0408, 0.0707, **snap)},  # +2%, +1%
    ]
    plain, side = so.summarise(rounds, ["plain", "sidecar"])
    assert side["rounds_used"] == 3 and side["rounds_left_out"] == [2]
    assert side["overhead_fraction_median"] == pytest.approx(0.02)
    assert side["overhead_fraction_per_round"] == pytest.approx([0.01, 0.03, 0.02])
    assert side["cpu_overhead_fraction_median"] == pytest.approx(0.01)
    assert side["hook_fraction_of_plain_step"] == pytest.approx(0.0002 / 0.040)
    assert "overhead_fraction_median" not in plain and plain["runs"] == 4
    assert "invalid_reason" not in side


def test_no_round_without_steal_leaves_the_overhead_invalid() -> None:
    rounds = [{"plain": fig(0.04, 0.07, steal=0.05), "sidecar": fig(0.04, 0.07)}]
    _, side = so.summarise(rounds, ["plain", "sidecar"])
    assert "overhead_fraction_median" not in side
    assert "steal" in side["invalid_reason"]


def test_a_failed_run_is_listed_and_leaves_its_round_out() -> None:
    rounds = [
        {"plain": fig(0.04, 0.07), "sidecar": {"error": "maxtext exited with 1"}},
        {"plain": fig(0.04, 0.07), "sidecar": fig(0.0404, 0.07)},
    ]
    _, side = so.summarise(rounds, ["plain", "sidecar"])
    assert side["failures"] == ["maxtext exited with 1"] and side["rounds_used"] == 1


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="steps=10"):
        so.run(steps=10, rounds=1)
    with pytest.raises(ValueError, match="rounds=0"):
        so.run(steps=1000, rounds=0)
    with pytest.raises(ValueError, match="variants"):
        so.run(variants=["sidecar"])


def section(per_round: list[float], *, quick: bool = False) -> dict[str, Any]:
    side = {
        "trainer": "maxtext",
        "variant": "sidecar",
        "runs": len(per_round),
        "rounds_used": len(per_round),
        "overhead_fraction_median": sorted(per_round)[len(per_round) // 2],
        "overhead_fraction_per_round": per_round,
        "cpu_overhead_fraction_median": 0.01,
    }
    return {
        "schema": 2,
        "name": "step_overhead",
        "quick": quick,
        "git_sha": "abc",
        "dirty": False,
        "config": {"rounds": len(per_round), "steps": 2000, "steal_limit": 0.01},
        "results": [{"trainer": "maxtext", "variant": "plain", "runs": len(per_round)}, side],
    }


def verdict(s: dict[str, Any]) -> Any:
    return next(v for v in targets(sections(s)) if v.target.startswith("step overhead, MaxText"))


def test_the_page_judges_the_sidecars_paired_overhead_only_where_every_round_agrees() -> None:
    assert verdict(section([0.01, 0.015, 0.012, 0.019, 0.005])).verdict == "met"
    assert verdict(section([0.03, 0.025, 0.022, 0.04, 0.05])).verdict == "not met"
    # Rounds on both sides of the budget: a median of -1.3% does not resolve 2%.
    unresolved = verdict(section([-0.064, 0.126, -0.013, -0.046, 0.055]))
    assert unresolved.verdict == "not measured" and "not resolved" in unresolved.basis
    assert verdict(section([0.01, 0.01, 0.01])).verdict == "not measured"  # fewer rounds than the method's 5
    assert verdict(section([0.01] * 5, quick=True)).verdict == "not measured"
    assert "Step overhead: MaxText, paired rounds" in render(section([0.01] * 5))


def test_the_step_events_steal_is_the_machines_from_proc_stat() -> None:
    from simjob.maxtext.cpu_elastic import machine_steal_seconds

    with open("/proc/stat", encoding="ascii") as f:
        fields = f.readline().split()
    first = machine_steal_seconds()
    assert first is not None and first >= int(fields[8]) / os.sysconf("SC_CLK_TCK")
    second = machine_steal_seconds()
    assert second is not None and second >= first


def test_the_in_process_overhead_adds_the_snapshots_and_the_hooks_own_time() -> None:
    s = section([-0.064, 0.126, -0.013, -0.046, 0.055])
    side = s["results"][1]
    side.update(snapshot_hook_overhead_fraction_median=0.0187, hook_fraction_of_plain_step=0.00862)
    v = next(v for v in targets(sections(s)) if v.target == "step overhead, MaxText (in process)")
    assert v.verdict == "not met" and "0.02732" in v.measured
    side.update(snapshot_hook_overhead_fraction_median=0.011)
    v = next(v for v in targets(sections(s)) if v.target == "step overhead, MaxText (in process)")
    assert v.verdict == "met"
    # Judged from the sidecar runs' own lines even where steal left too few rounds for the paired verdict.
    side.update(rounds_used=3, overhead_fraction_per_round=[-0.002, 0.143, 0.029])
    paired, in_process = (v for v in targets(sections(s)) if v.target.startswith("step overhead, MaxText"))
    assert paired.verdict == "not measured" and "fewer than the 5" in paired.basis
    assert in_process.target.endswith("(in process)") and in_process.verdict == "met"


def test_a_concurrent_round_cancels_a_slower_cpu() -> None:
    # CPU 0 runs everything 10% slower; the sidecar costs 2% more than plain. Half 1: plain on CPU 0,
    # the sidecar on CPU 1; half 2 swapped. Either half alone reads the CPUs' difference, the pair does not.
    slow, over = 1.10, 1.02
    plain = so.swapped_pair(
        [fig(0.040 * slow, 0.040 * slow, steady_steps=300, tag="p0"), fig(0.040, 0.040, steady_steps=310, tag="p1")]
    )
    side = so.swapped_pair(
        [
            fig(0.040 * over, 0.040 * over, steady_steps=305, tag="s1"),
            fig(0.040 * over * slow, 0.040 * over * slow, 0.01, steady_steps=300, tag="s0"),
        ]
    )
    assert side["steady_steps"] == 300 and side["steal_fraction"] == 0.01 and side["tags"] == ["s1", "s0"]
    _, row = so.summarise([{"plain": plain, "sidecar": side}], ["plain", "sidecar"])
    assert row["overhead_fraction_median"] == pytest.approx(0.02, abs=1e-4)
    # Either half read alone would be off by the CPUs' difference.
    assert 0.040 * over / (0.040 * slow) - 1 == pytest.approx(-0.0727, abs=1e-3)


def test_a_concurrent_round_with_a_failed_half_is_a_failed_run() -> None:
    got = so.swapped_pair([fig(0.04, 0.04, steady_steps=300), {"error": "so-sidecar-r0-c1: exited with 1"}])
    assert got == {"error": "so-sidecar-r0-c1: exited with 1"}
    _, row = so.summarise([{"plain": fig(0.04, 0.04), "sidecar": got}], ["plain", "sidecar"])
    assert row["failures"] == ["so-sidecar-r0-c1: exited with 1"] and "invalid_reason" in row


def test_concurrent_needs_a_pair() -> None:
    with pytest.raises(ValueError, match="exactly one other variant"):
        so.run(steps=1000, rounds=1, concurrent=True)


def test_the_page_says_how_a_concurrent_run_was_paired() -> None:
    s = section([0.01] * 5)
    assert "back to back" in render(s) and "side by side" not in render(s)
    s["config"] |= {"concurrent": True, "cores": [0, 1]}
    page = render(s)
    assert "side by side, each pinned to one CPU (0, 1)" in page and "back to back" not in page
