"""The helper that reads the coordinator's measured RSS from the benchmarks' JSON (tests/deploy/measured.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.measured import PRODUCED_BY, RSS_MARGIN, MeasuredRss, assert_limit_covers, coordinator_rss


def store(tmp_path: Path, rows: list[dict[str, Any]] | None) -> Path:
    benchmarks: dict[str, Any] = {}
    if rows is not None:
        benchmarks["scale"] = {"schema": 2, "name": "scale", "git_sha": "a" * 40, "results": rows}
    p = tmp_path / "benchmarks.json"
    p.write_text(json.dumps({"schema": 2, "benchmarks": benchmarks}))
    return p


def test_a_run_that_reached_the_capacity_counts_valid_or_not(tmp_path: Path) -> None:
    p = store(
        tmp_path,
        [
            {"workers": 1000, "coordinator_rss_mib": 100.0, "valid": True},
            {"workers": 10000, "coordinator_rss_mib": 600.5, "valid": False, "invalid_reason": "saturated"},
            {"workers": 20000, "valid": False, "invalid_reason": "did not reach steady state"},  # no RSS
        ],
    )
    m = coordinator_rss(p)
    assert (m.workers, m.rss_mib, m.valid) == (10000, 600.5, False)
    assert "measured" in str(m)


def test_below_the_capacity_the_line_through_the_sizes_is_extended(tmp_path: Path) -> None:
    rows = [
        {"workers": 1000, "coordinator_rss_mib": 100.0, "valid": True},
        {"workers": 2500, "coordinator_rss_mib": 175.0, "valid": True},
        # Collapsed while registering: its RSS with the 4,000 registered then.
        {"workers": 5000, "valid": False, "workers_registered": 4000, "coordinator_rss_mib_at_collapse": 250.0},
        {"workers": 10000, "valid": False, "workers_registered": 0},
    ]
    m = coordinator_rss(store(tmp_path, rows))
    assert m.workers == 10000 and abs(m.rss_mib - 550.0) < 1e-6  # 50 MiB + 0.05 MiB per worker
    assert not m.valid and "extrapolated from 100 MiB at 1000" in str(m)


def test_one_size_is_not_enough_to_extrapolate(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="two sizes are needed"):
        coordinator_rss(store(tmp_path, [{"workers": 1000, "coordinator_rss_mib": 100.0, "valid": True}]))


def test_a_limit_below_the_margin_fails_naming_both() -> None:
    m = MeasuredRss(10000, 600.0, True, None, ((10000, 600.0),))
    assert_limit_covers(int(RSS_MARGIN * 600 * 2**20), m)
    with pytest.raises(AssertionError, match=r"below 1.5 x the measured 600.0 MiB at 10000 workers"):
        assert_limit_covers(512 * 2**20, m)


@pytest.mark.parametrize(
    "rows",
    [None, [], [{"workers": 10000, "valid": False}]],
    ids=["no scale benchmark", "no rows", "no RSS recorded"],
)
def test_no_scale_figure_names_the_make_target(tmp_path: Path, rows: list[dict[str, Any]] | None) -> None:
    with pytest.raises(AssertionError, match=PRODUCED_BY):
        coordinator_rss(store(tmp_path, rows))


def test_a_page_era_file_is_not_read(tmp_path: Path) -> None:
    """The JSON before the common shape (no schema 2) is not a measurement of the current code."""
    p = tmp_path / "benchmarks.json"
    p.write_text(json.dumps({"scale": {"sizes": [{"workers": 10000, "rss_mib": 596.2}]}}))
    with pytest.raises(AssertionError, match="no scale benchmark in the current format"):
        coordinator_rss(p)
    with pytest.raises(AssertionError, match="does not exist"):
        coordinator_rss(tmp_path / "missing.json")
