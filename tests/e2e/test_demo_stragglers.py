"""Issue 55's "Done when" on the demo: a slow slice is drained, a transient and a job-wide slowdown
are not, and the summary's ``stragglers`` says so with the step rate around each verdict.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from simjob.harness import straggler_flags

pytestmark = pytest.mark.e2e


def _demo(tmp_path: Path, fault: str) -> dict[str, Any]:
    summary = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "agent", "demo", "--steps", "400", "--fault", fault, "--quiet"]
    cmd += ["--workdir", str(tmp_path / "job"), "--summary-json", str(summary), "--run-timeout", "400"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(summary.read_text())
    assert out["final_step"] == 400, out
    return out


def _verdicts(out: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v.get(k) for k in ("slice", "scope", "action", "reason")} for v in out["stragglers"]]


def test_a_slow_slice_is_drained_and_the_job_runs_faster_without_it(tmp_path: Path) -> None:
    out = _demo(tmp_path, "slow:2:1.5@40")
    drains = [v for v in out["stragglers"] if v["action"] == "drain"]
    assert drains, _verdicts(out)
    assert {v["slice"] for v in drains} == {2}, _verdicts(out)
    for v in drains:
        assert v["scope"] == "slice"
        assert v["seconds_from_slowdown"] is not None and v["seconds_from_slowdown"] > 0, v
        assert v["step_rate_before"] is not None and v["step_rate_during"] is not None, v
        assert v["step_rate_after"] is not None and v["step_rate_after"] > v["step_rate_during"], v
    # The drained slice stays drained: the job ends on the other three.
    assert out["slices_timeline"][-1]["slices"] == [0, 1, 3], out["slices_timeline"]


def test_a_transient_slowdown_shorter_than_the_windows_need_drains_nothing(tmp_path: Path) -> None:
    out = _demo(tmp_path, "slow:2:1.5@40+5")
    assert not [v for v in out["stragglers"] if v["action"] == "drain"], _verdicts(out)
    assert out["slices_timeline"][-1]["slices"] == [0, 1, 2, 3], out["slices_timeline"]


def test_a_slowdown_on_every_slice_is_a_job_wide_alert_not_a_drain(tmp_path: Path) -> None:
    out = _demo(tmp_path, "slow:*:1.3@40")
    assert not [v for v in out["stragglers"] if v["action"] == "drain"], _verdicts(out)
    job = [v for v in out["stragglers"] if v["scope"] == "job"]
    assert job, _verdicts(out)
    assert any(v["action"] == "alert" for v in job), _verdicts(out)
    assert out["slices_timeline"][-1]["slices"] == [0, 1, 2, 3], out["slices_timeline"]


@pytest.mark.parametrize(("window", "enter"), [(0.5, 14), (2.0, 4), (3.0, 0)])
def test_demo_windows_ask_for_seconds_of_evidence_not_a_count_of_windows(window: float, enter: int) -> None:
    flags = straggler_flags(window)
    assert flags.get("straggler_enter_hits", 0) == enter
    if flags:
        assert flags["straggler_enter_hits"] * window >= 7.0 > flags["straggler_enter_hits"] * window - window
        assert flags["straggler_leave_hits"] < flags["straggler_enter_hits"] <= flags["straggler_windows"]
