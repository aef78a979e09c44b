"""Smoke runs of the benchmark suite: ``python -m bench <name> --quick --json PATH``.

Each benchmark runs in its smallest form (one run, small sizes; about 70 s for
all five on two cores) and must produce its JSON with the keys the docs and
the README rely on, and render its section of ``benchmarks.md`` (into a
temporary directory, never the repository's ``docs/``). Targets are not
asserted here: smoke-sized figures are not representative.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_bench(tmp_path: Path, name: str, timeout: float = 180) -> dict[str, Any]:
    out = tmp_path / f"{name}.json"
    docs = tmp_path / "docs"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", name, "--quick", "--json", str(out), "--docs-dir", str(docs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert out.exists(), proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["name"] == name
    assert data["quick"] is True
    assert "error" not in data, data.get("error")
    assert data["targets"], "every benchmark states its targets"
    for t in data["targets"]:
        assert {"name", "target", "measured", "unit", "met", "note"} <= set(t), t
    md = (docs / "benchmarks.md").read_text()
    assert "## Targets" in md
    stored = json.loads((docs / "benchmarks.json").read_text())
    assert name in stored
    return data


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@pytest.mark.e2e
def test_recovery_smoke(tmp_path: Path) -> None:
    d = run_bench(tmp_path, "recovery")
    ratios = d["ratios"]
    assert is_number(ratios["full_restart"]) and is_number(ratios["checkpoint_rewind"]), ratios
    assert is_number(ratios["delay_s"])
    for s in ("full_restart", "checkpoint_rewind", "elastic_sidecar"):
        rows = d["table"][s]
        assert rows, s
        for row in rows.values():
            assert is_number(row["recovery_s"]), (s, row)
            assert is_number(row["lost_steps"]), (s, row)
            assert is_number(row["fault_cost_s"]), (s, row)
            assert row["goodput"], (s, row)
    assert (tmp_path / "docs" / "benchmarks.md").read_text().count("Recovery") >= 1


def test_detection_smoke(tmp_path: Path) -> None:
    d = run_bench(tmp_path, "detection")
    for kind in ("kill", "hang", "not_serving"):
        k = d["by_kind"][kind]
        assert k["available"] and is_number(k["decision_s"]), (kind, k)
    for kind in ("pubsub_notice", "metadata_notice"):
        k = d["by_kind"][kind]
        assert "available" in k
        assert is_number(k.get("decision_s")) if k["available"] else k.get("note"), (kind, k)


def test_scale_smoke(tmp_path: Path) -> None:
    d = run_bench(tmp_path, "scale")
    (size,) = d["sizes"]
    assert size["workers"] == 200
    assert "error" not in size, size
    assert is_number(size["cpu_cores"]) and is_number(size["rss_mib"])
    assert is_number(size["hold_fanout"]["p50_s"]) and is_number(size["hold_fanout"]["p99_s"])
    assert size["hold_fanout"]["received"] == size["hold_fanout"]["expected"]


def test_flush_smoke(tmp_path: Path) -> None:
    d = run_bench(tmp_path, "flush")
    (size,) = d["sizes"]
    assert size["size_mib"] == 32
    assert is_number(size["ratio"]) and size["ratio"] > 0
    assert is_number(size["orbax_mib_per_s"]) and is_number(size["raw_mib_per_s"])
    assert is_number(d["step_boundary"]["step_boundary_us"])


def test_footprint_smoke(tmp_path: Path) -> None:
    d = run_bench(tmp_path, "footprint")
    s = d["summary"]
    for key in (
        "coordinator_cpu_pct",
        "coordinator_rss_mib",
        "coordinator_startup_s",
        "worker_cpu_pct",
        "worker_rss_mib",
        "worker_startup_s",
    ):
        assert is_number(s[key]), (key, s)
