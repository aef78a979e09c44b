"""docs/reliability.md's renderer: rows per scenario, runs counted, figures from the records only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simjob.reliability_report import main

SETTINGS = {"checkpoint_period": 10, "timeout": 10.0, "settle": 4.0, "startup": 8.0}


def run(key: str, passed: bool, **kw: object) -> dict[str, object]:
    return {
        "key": key,
        "title": f"title of {key}",
        "how": "how",
        "passed": passed,
        "failure": None if passed else "AssertionError: lost 7 steps (at most 1)\nassert 7 <= 1\n  + where ...",
        "result": "training completed",
        "expected": "training completes",
        "detection_seconds": kw.get("detection"),
        "detection_source": "WorkerLost(stream_closed)" if kw.get("detection") is not None else None,
        "recovery_seconds": kw.get("recovery"),
        "lost_steps": kw.get("lost", 0),
        "retries_spent": kw.get("spent", 0),
        "retries_in_journal": kw.get("journal", 0),
        "phase_at_kill": "holding",
    }


def test_rows_count_runs_and_show_median_range_and_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = {"commit": "abc123", "settings": SETTINGS, "runs": [run("k1", True, detection=0.01, recovery=1.0)]}
    b = {
        "commit": "abc123",
        "settings": SETTINGS,
        "runs": [
            run("k1", True, detection=0.03, recovery=3.0),
            run("k2", False, lost=7, spent=0, journal=1),
        ],
    }
    pa, pb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "r.md"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    assert main([str(pa), str(pb), "--out", str(out)]) == 0
    doc = out.read_text()
    assert "Commit `abc123`" in doc and "3 scenario runs, 1 of 2 scenarios passed every run" in doc
    row1 = next(ln for ln in doc.splitlines() if ln.startswith("| title of k1"))
    assert "0.02 s (0.01 s-0.03 s) (WorkerLost(stream_closed))" in row1 and "| 2 | 2/2 |" in row1, row1
    assert "2.00 s (1.00 s-3.00 s)" in row1, row1
    row2 = next(ln for ln in doc.splitlines() if ln.startswith("| title of k2"))
    assert "| 7 | 0 (1) | 1 | 0/1 **FAIL** |" in row2, row2
    assert "(`k2`, jax): AssertionError: lost 7 steps (at most 1)" in doc and "where ..." not in doc
    assert str(Path.cwd()) not in doc  # no path of the machine that ran it


def test_a_scenario_on_two_trainer_backends_is_two_rows(tmp_path: Path) -> None:
    """A record names its backend; one without is from the JAX trainer (the matrix ran only on it before)."""
    doc = {
        "commit": "abc123",
        "settings": SETTINGS,
        "runs": [
            {**run("k1", True, recovery=1.0), "backend": "numpy"},
            run("k1", True, recovery=3.0),
            {**run("k1", False, lost=7), "backend": "jax"},
        ],
    }
    p, out = tmp_path / "a.json", tmp_path / "r.md"
    p.write_text(json.dumps(doc))
    assert main([str(p), "--out", str(out)]) == 0
    rows = [ln for ln in out.read_text().splitlines() if ln.startswith("| title of k1")]
    assert len(rows) == 2, rows
    assert rows[0].startswith("| title of k1 | numpy |") and "| 1.00 s |" in rows[0] and "| 1/1 |" in rows[0], rows[0]
    assert rows[1].startswith("| title of k1 | jax |") and "| 1/2 **FAIL** |" in rows[1], rows[1]
    assert "(`k1`, jax): AssertionError" in out.read_text()


def test_unreadable_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
