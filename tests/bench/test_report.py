"""bench.report renders docs/benchmarks.md from docs/benchmarks.json alone; bench.__main__ merges runs into it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import merge
from bench.report import COMMANDS, HOST_LINK, main, render, sections

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_committed_page_is_the_render_of_the_committed_json() -> None:
    data = json.loads((DOCS / "benchmarks.json").read_text())
    host_link = json.loads((DOCS / HOST_LINK).read_text())
    page = render(data, {"recovery": "recovery.png"}, host_link=host_link)
    assert page == (DOCS / "benchmarks.md").read_text()
    assert set(sections(data)) == {"recovery", "detection", "scale", "footprint"}
    assert len(page.splitlines()) <= 150


def test_each_section_shows_a_command_the_bench_accepts_today() -> None:
    import shlex

    from bench.__main__ import build_parser

    page = render(json.loads((DOCS / "benchmarks.json").read_text()))
    for name, (command, make, _) in COMMANDS.items():
        assert f"Run: `{command}` (`{make}`)" in page
        argv = shlex.split(command)
        assert argv[:3] == ["python", "-m", "bench"] and build_parser().parse_args(argv[3:]).name == name


def section(name: str, rows: list[dict[str, Any]], sha: str = "a" * 40, dirty: bool = False) -> dict[str, Any]:
    return {
        "schema": 2,
        "name": name,
        "git_sha": sha,
        "dirty": dirty,
        "machine": {"cores": 2},
        "config": {"argv": [name]},
        "results": rows,
        "started_at": "2026-12-01 00:00:00 UTC",
    }


def test_a_row_marked_invalid_or_not_run_says_why_on_the_page() -> None:
    rows = [
        {"kind": "kill", "runs": 5, "decision_seconds_median": 0.01},
        {"kind": "hang", "runs": 5, "valid": False, "invalid_reason": "a heartbeat lost"},
    ]
    page = render({"benchmarks": {"detection": section("detection", rows)}})
    assert "| kill | 5 |" in page and "| ok |" not in page  # detection has no status column
    rec = [
        {"trainer": "maxtext", "strategy": "sidecar", "checkpoint_period": 20, "runs": 5, "params": 7},
        {
            "trainer": "maxtext",
            "strategy": "full_restart",
            "checkpoint_period": 20,
            "runs": 0,
            "status": "not_run",
            "invalid_reason": "not run: no MaxText interpreter",
        },
        {"trainer": "maxtext", "strategy": "checkpoint_rewind", "checkpoint_period": 20, "invalid_reason": "drift"},
    ]
    page = render({"benchmarks": {"recovery": section("recovery", rec)}})
    assert "| sidecar | 5 |" in page and page.count("| ok |") == 1
    assert "| not run: no MaxText interpreter |" in page and "| INVALID: drift |" in page
    # A row whose runs all failed has no phases, beside rows that have them.
    rec[0]["phase_seconds_median"] = {"detect": 0.5, "hold": 1.0}
    page = render({"benchmarks": {"recovery": section("recovery", rec)}})
    assert "| sidecar | kill | 5 |" in page and "detect 0.5, hold 1" in page
    assert "| full_restart | kill | 0 |" in page


def test_a_missing_or_broken_file_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json", str(tmp_path / "none.json")]) == 2
    assert "none.json" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["--json", str(bad)]) == 2
    assert "bad.json" in capsys.readouterr().err


def test_a_run_of_one_model_size_replaces_only_that_sizes_rows(tmp_path: Path) -> None:
    store = tmp_path / "benchmarks.json"
    tiny = [{"trainer": "maxtext", "strategy": "sidecar", "checkpoint_period": 20}]
    larger = [{"trainer": "maxtext-larger", "strategy": "sidecar", "checkpoint_period": 20}]
    merge(store, [section("recovery", tiny, "a" * 40)])
    data = merge(store, [section("recovery", larger, "b" * 40)])
    rec = data["benchmarks"]["recovery"]
    assert [r["trainer"] for r in rec["results"]] == ["maxtext", "maxtext-larger"]
    assert rec["config"]["by_trainer"]["maxtext"]["git_sha"] == "a" * 40
    assert rec["config"]["by_trainer"]["maxtext-larger"]["git_sha"] == "b" * 40
    assert data["git_shas"] == ["a" * 40, "b" * 40]
    # A run of the same size replaces its rows; a dirty run replaces the section.
    again = merge(store, [section("recovery", tiny, "c" * 40)])["benchmarks"]["recovery"]
    assert sorted(r["trainer"] for r in again["results"]) == ["maxtext", "maxtext-larger"]
    dirty = merge(store, [section("recovery", tiny, "d" * 40, dirty=True)])["benchmarks"]["recovery"]
    assert [r["trainer"] for r in dirty["results"]] == ["maxtext"]
