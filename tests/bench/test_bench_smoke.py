"""Smoke runs of the benchmark suite: ``python -m bench <name> --quick --json PATH --docs-dir TMP``.

Each benchmark runs in a tiny form and must produce the common JSON shape (``git_sha``,
``dirty``, ``machine``, ``config``, ``results``) with the row fields the report and automation
read, and the report must render a page from it (into a temporary directory, never the
repository's ``docs/``). Figures are not bounded: smoke-sized ones are not representative.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP = {"git_sha", "dirty", "machine", "config", "results"}


def run_bench(tmp_path: Path, name: str, *args: str, timeout: float = 300) -> dict[str, Any]:
    out = tmp_path / f"{name}.json"
    docs = tmp_path / "docs"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", name, "--quick", "--json", str(out), "--docs-dir", str(docs), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    data = json.loads(out.read_text())
    assert TOP <= set(data), sorted(data)
    assert data["name"] == name and data["quick"] is True
    assert "error" not in data, data.get("error")
    assert re.fullmatch(r"[0-9a-f]{40}", data["git_sha"]), data["git_sha"]
    assert isinstance(data["dirty"], bool)
    for key in ("cores", "memory_gib", "cpu_model", "python", "jax"):
        assert key in data["machine"], key
    assert data["config"]["argv"][0] == name
    assert data["results"], "every benchmark reports result rows"
    stored = json.loads((docs / "benchmarks.json").read_text())
    assert TOP <= set(stored) and name in stored["benchmarks"]
    assert all(r["benchmark"] == name for r in stored["results"])
    md = (docs / "benchmarks.md").read_text()
    assert "# Benchmarks" in md and data["git_sha"][:12] in md
    return data


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


RECOVERY_FIELDS = {
    "trainer",
    "strategy",
    "fault",
    "replacement_delay",
    "checkpoint_period",
    "runs",
    "lost_steps_median",
    "fault_cost_seconds_median",
    "fault_cost_seconds_p90",
    "recovery_seconds_median",
}


def test_scale_smoke(tmp_path: Path) -> None:
    # One invocation for both scenarios. A generous grace: on a loaded machine the restarted coordinator
    # takes seconds to import; with every worker back it is not waited out.
    d = run_bench(tmp_path, "scale", "--scenarios", "hold_cycles,coordinator_restart", "--rejoin-grace", "30")
    hold, restart = d["results"]
    from agent import constants as C

    assert hold["workers"] == 200 and hold["scenario"] == "hold_cycles" and hold["runs"] == 1
    assert hold["heartbeat_interval"] == C.HEARTBEAT_INTERVAL_SECONDS  # the shipped defaults
    assert hold["heartbeat_timeout"] == C.HEARTBEAT_TIMEOUT_SECONDS
    assert hold["valid"] is True, hold.get("invalid_reason")
    assert hold["delivered_fraction"] == 1.0 and hold["fanout_p99_seconds"] > 0
    assert is_number(hold["coordinator_cores"]) and hold["coordinator_rss_mib"] > 0
    assert hold["coordinator_socket_drops"] == 0  # read from the coordinator's own metrics
    assert hold["datagram_workers"] == 200  # every worker's heartbeats came by datagram
    (cycle,) = next(s for s in d["sizes"] if s["scenario"] == "hold_cycles")["cycles"]
    assert cycle["hold_received"] == cycle["hold_expected"] == 199
    assert cycle["resume_received"] == cycle["resume_expected"] == 200
    assert restart["scenario"] == "coordinator_restart" and restart["workers"] == 200
    assert restart["valid"] is True, restart.get("invalid_reason")
    assert restart["hosts_lost"] == 0 and restart["coordinator_socket_drops"] == 0
    assert 0 < restart["restart_to_serving_seconds"] <= restart["all_back_seconds"] <= 30
    md = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "Coordinator restart (SIGKILL under load" in md


def test_detection_smoke(tmp_path: Path) -> None:
    d = run_bench(tmp_path, "detection")
    rows = {r["kind"]: r for r in d["results"]}
    for kind in ("kill", "hang", "not_serving"):
        # A string message: pytest prints it whole (a dict would be cut to "...", hiding the error reasons).
        assert rows[kind]["available"] and is_number(rows[kind]["decision_seconds_median"]), json.dumps(rows[kind])
    for kind in ("pubsub_notice", "metadata_notice"):
        r = rows[kind]
        assert is_number(r["decision_seconds_median"]) if r["available"] else r.get("note"), r


def test_footprint_smoke(tmp_path: Path) -> None:
    d = run_bench(tmp_path, "footprint")
    rows = {r["role"]: r for r in d["results"]}
    for role in ("coordinator", "worker"):
        for key in ("idle_cpu_pct_median", "rss_mib_median", "startup_seconds_median"):
            assert is_number(rows[role][key]), (role, key, rows[role])


@pytest.mark.e2e
@pytest.mark.maxtext
@pytest.mark.slow
def test_recovery_maxtext_smoke(tmp_path: Path) -> None:
    """One run per row (a few minutes): the real MaxText under each strategy."""
    d = run_bench(
        tmp_path,
        "recovery",
        "--repeats",
        "1",
        "--checkpoint-periods",
        "10",
        "--delays",
        "1",
        timeout=1800,
    )
    rows = d["results"]
    for r in rows:
        assert RECOVERY_FIELDS <= set(r) and r["trainer"] == "maxtext", r
    ran = {r["strategy"]: r for r in rows if r["runs"]}
    assert set(ran) == {"full_restart", "checkpoint_rewind", "local_checkpoint_rewind", "sidecar"}, [
        r.get("invalid_reason") for r in rows
    ]
    for r in ran.values():
        assert r["runs"] == 1 and r["failed_runs"] == 0, r
        assert is_number(r["fault_cost_seconds_median"]) and is_number(r["recovery_seconds_median"]), r
        assert r["local_window_work_steps_median"] > 0, r
        assert is_number(r["params"]) and r["params"] > 0
    assert ran["sidecar"]["lost_steps_median"] == 0
    assert ran["sidecar"]["hook_seconds_per_step_median"] > 0 and ran["sidecar"]["snapshot_cost_runs"] == 1
    # The frequent local checkpoint (every 5 steps against the period's 10) loses fewer steps than the rewind.
    assert ran["local_checkpoint_rewind"]["lost_steps_max"] <= 5, ran["local_checkpoint_rewind"]
