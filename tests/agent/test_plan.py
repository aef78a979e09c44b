"""``elastic-sidecar plan``: the model behaves as a model must, and the command writes what it says."""

from __future__ import annotations

import importlib.metadata
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from agent import plan
from agent.cli import main


def _run(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / f"plan{len(list(tmp_path.iterdir()))}.json"
    assert main(["plan", *args, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _by_name(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["strategy"]: s for s in result["strategies"]}


def test_the_70b_preset_writes_its_json_and_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png, out = tmp_path / "G.png", tmp_path / "P.json"
    assert main(["plan", "--preset", "llama3-70b-v5p", "--json", str(out), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads(out.read_text())
    assert [s["strategy"] for s in result["strategies"]] == [
        "full_restart",
        "checkpoint_rewind",
        "multi_tier",
        "sidecar",
    ]
    for s in result["strategies"]:
        g = s["goodput"]
        assert 0 <= g["p10"] <= g["p50"] <= g["p90"] <= 1, s
        loss = s["loss_per_event_minutes"]
        assert set(plan.PHASES) | {"steady_overhead", "total"} == set(loss)
        assert loss["total"] == pytest.approx(sum(v for k, v in loss.items() if k != "total"), abs=0.01)
        assert 0 <= s["steady_overhead_fraction"] < 0.05
    assert {i["source"] for i in result["inputs"]} <= set(plan.SOURCES)
    for i in result["inputs"]:
        assert set(i) >= {"name", "value", "source", "citation"}, i
        if i["source"] == "published":
            assert i["citation"], i
        if i["source"] == "swept":
            assert isinstance(i["value"], list) and i["value"][0] < i["value"][1], i
    assert {b["baseline"] for b in result["break_even"]} == {"full_restart", "checkpoint_rewind", "multi_tier"}
    assert result["recommendations"]["checkpoint_period_steps"] >= 1
    assert "sidecar" in capsys.readouterr().out


@pytest.mark.parametrize("preset", sorted(plan.PRESETS))
def test_every_preset_cites_its_published_inputs_and_sweeps_ranges(preset: str) -> None:
    names = {i.name for i in plan.PRESETS[preset]}
    assert {"params", "slices", "step_seconds", "mtbi_hours", "recovery_success", "rebuild_seconds"} <= names
    for i in plan.PRESETS[preset]:
        assert i.source in plan.SOURCES
        assert i.source != "published" or i.citation, i
        assert i.source != "swept" or isinstance(i.value, tuple), i
    by = {i.name: i for i in plan.PRESETS[preset]}
    assert by["rebuild_seconds"].source == by["recovery_success"].source == "swept"


def test_a_published_input_without_a_citation_or_a_swept_point_is_refused() -> None:
    with pytest.raises(ValueError, match="citation"):
        plan.Input("x", 1.0, "published", "s")
    with pytest.raises(ValueError, match="range"):
        plan.Input("x", 1.0, "swept", "s")


def test_the_flags_set_their_inputs_as_the_users(tmp_path: Path) -> None:
    result = _run(tmp_path, "--mtbi-hours", "12", "--recovery-success", "0.9", "--trials", "50")
    by = {i["name"]: i for i in result["inputs"]}
    assert by["mtbi_hours"] == {**by["mtbi_hours"], "value": 12.0, "source": "user"}
    assert by["recovery_success"] == {**by["recovery_success"], "value": 0.9, "source": "user"}
    assert result["mtbi_hours"] == 12.0


def test_every_strategys_goodput_falls_as_interruptions_come_more_often(tmp_path: Path) -> None:
    p50 = [
        {k: s["goodput"]["p50"] for k, s in _by_name(_run(tmp_path, "--mtbi-hours", h)).items()}
        for h in ("50", "12", "4")
    ]
    for s in plan.STRATEGIES:
        assert p50[0][s] > p50[1][s] > p50[2][s], (s, p50)


def test_with_almost_no_interruptions_goodput_is_one_less_the_steady_overhead(tmp_path: Path) -> None:
    for s in _run(tmp_path, "--mtbi-hours", "100000")["strategies"]:
        assert abs(s["goodput"]["p50"] - (1 - s["steady_overhead_fraction"])) <= 0.002, s


def test_with_no_in_process_recovery_the_sidecar_keeps_no_more_than_a_full_restart(tmp_path: Path) -> None:
    by = _by_name(_run(tmp_path, "--recovery-success", "0"))
    assert by["sidecar"]["goodput"]["p50"] <= by["full_restart"]["goodput"]["p50"]
    assert by["sidecar"]["loss_per_event_minutes"]["fallback"] > 0


def test_the_same_seed_gives_the_same_answer_and_another_seed_another(tmp_path: Path) -> None:
    a, b = (_run(tmp_path, "--trials", "100", "--seed", "7") for _ in range(2))
    c = _run(tmp_path, "--trials", "100", "--seed", "8")
    assert a == b
    assert a["strategies"] != c["strategies"]


def _job(**kw: Any) -> plan.Job:
    inputs = plan.with_user(plan.PRESETS["llama3-70b-v5p"], **kw)
    return plan._job({i.name: i for i in inputs}, random.Random(0))


def test_a_notice_costs_the_sidecar_no_steps_and_a_crash_costs_the_rewind_twice() -> None:
    job = _job()
    notice = plan.event_losses(job, "notice", 0.5, 1800.0, failed=False)
    kill = plan.event_losses(job, "kill", 0.5, 1800.0, failed=False)
    assert notice["sidecar"]["recompute"] == 0 and notice["sidecar"]["detect"] == 0
    assert kill["sidecar"]["recompute"] > 0
    # The rewind loses half a period at the shrink and the degraded run's steps since a checkpoint at the grow.
    assert kill["checkpoint_rewind"]["recompute"] > 0.5 * job.ckpt_period
    assert kill["full_restart"]["degraded"] == 1800.0
    assert kill["sidecar"]["degraded"] < 1800.0 / job.slices


def test_a_failed_recovery_costs_the_sidecar_at_least_a_full_restart() -> None:
    job = _job()
    for kind in ("kill", "hang", "notice"):
        loss = plan.event_losses(job, kind, 0.3, 900.0, failed=True)
        assert sum(loss["sidecar"].values()) >= sum(loss["full_restart"].values())
        assert loss["sidecar"]["fallback"] == sum(loss["sidecar"].values())


def test_a_job_that_may_not_shrink_waits_for_the_replacement() -> None:
    job = _job(min_slices=4.0)
    loss = plan.event_losses(job, "kill", 0.5, 1200.0, failed=False)
    for s in ("checkpoint_rewind", "multi_tier", "sidecar"):
        assert loss[s]["degraded"] == 1200.0, s


def test_break_even_reads_both_directions() -> None:
    def loss(total: float, overhead: float) -> plan.Loss:
        return {**plan._zero(), "recompute": total, "overhead": overhead}

    assert plan.break_even(loss(60, 0.01), loss(3600, 0.0))["sidecar_keeps_more"] == "more_often"
    assert plan.break_even(loss(60, 0.0), loss(3600, 0.01))["sidecar_keeps_more"] == "always"
    assert plan.break_even(loss(3600, 0.01), loss(60, 0.0))["sidecar_keeps_more"] == "never"
    less = plan.break_even(loss(3600, 0.0), loss(60, 0.01))
    assert less["sidecar_keeps_more"] == "less_often" and less["mtbi_hours"] > 0


def test_young_daly_grows_with_the_square_root_of_the_interval() -> None:
    assert plan.young_daly_seconds(10, 400 * 3600) == pytest.approx(2 * plan.young_daly_seconds(10, 100 * 3600) + 10)


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--recovery-success", "1.5"), ("--mtbi-hours", "0"), ("--mtbi-hours", "nan"), ("--announced-share", "-0.1")],
)
def test_an_out_of_range_value_exits_2_naming_the_flag(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["plan", flag, value])
    assert e.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_a_plot_without_matplotlib_exits_2_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["plan", "--plot", str(tmp_path / "G.png")]) == 2
    assert "matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "G.png").exists()


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"elastic-sidecar {importlib.metadata.version('elastic-sidecar')}"
