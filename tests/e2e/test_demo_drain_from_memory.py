"""A notice's drain end to end: served from memory where the slices that remain may train on, flushed where not.

Issue 52's done-when: ``demo --fault notice:1.0@30`` writes nothing to storage for the drain, loses no
step and resumes from memory; the same notice with ``--min-slices 4`` (no slice may leave) flushes
before the host goes (the demo kills it ``--notice-deadline`` seconds after the notice, 4 s by default).
The first run also stands for tests/e2e/test_demo.py's Pub/Sub notice (which runs under --runslow).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

NOTICE_DEADLINE = 4.0


def _demo(
    tmp_path: Path, *extra: str, steps: int = 60
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], str]:
    summary = tmp_path / "summary.json"
    job = tmp_path / "job"
    proc = subprocess.run(
        [sys.executable, "-m", "agent", "demo", "--workdir", str(job), "--summary-json", str(summary)]
        + ["--steps", str(steps), "--step-seconds", "0.1", "--checkpoint-period", "20", "--timeout", "20"]
        + ["--run-timeout", "150", "--notice-deadline", str(NOTICE_DEADLINE), "--fault", "notice:1.0@30", *extra],
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    read = lambda p: [json.loads(x) for x in p.read_text().splitlines() if x.strip()]  # noqa: E731
    return json.loads(summary.read_text()), read(job / "trainer-events.jsonl"), read(job / "journal.jsonl"), out


@pytest.mark.e2e
def test_a_notice_drain_goes_on_from_memory_with_nothing_written(tmp_path: Path) -> None:
    # 100 steps of 0.1 s: the host dies (4 s after the notice at step 30) while the job still trains.
    s, tev, journal, out = _demo(tmp_path, steps=100)
    (f,) = s["faults"]
    assert f["detection_source"] == "NodeNotice(pubsub)", f
    assert f["flush_bytes"] == 0 and f["lost_steps"] == 0 and f["restored_from"] == "memory", f
    assert not f["interrupted_step"], f
    assert (f["slices_before"], f["slices_after"]) == (4, 3), f
    (held,) = [e for e in tev if e["kind"] == "held" and e["t"] >= f["time"]]
    assert held["snapshot"] and not held["flush"], held
    # The periodic checkpoints carry on: every one after the drain is a multiple of the period.
    after = [e["step"] for e in tev if e["kind"] == "checkpoint_started" and e["t"] > held["t"]]
    assert after and all(step % 20 == 0 for step in after), after
    hold = next(j for j in journal if any(a["type"] == "HoldTrainer" for a in j["actions"]) and j["time"] >= f["time"])
    assert "nothing to storage" in hold["reason"] and "with snapshot" in hold["reason"], hold["reason"]
    assert s["final_step"] == 100, out[-2000:]
    lost = [j for j in journal if j["trigger"] == "WorkerLost" and j["event_detail"]["slice"] == 1]
    assert lost and not any(a["type"] == "HoldTrainer" for a in lost[0]["actions"]), "the death itself needed no hold"
    # The notice named the slices that remain: their mesh's step was compiled ahead, beside the steps on four
    # slices (the hold waited for it, training on), so the resume compiled nothing.
    prepare = next(j for j in journal if any(a["type"] == "PrepareTrainer" for a in j["actions"]))
    assert prepare["time"] <= hold["time"], (prepare, hold)
    (resumed,) = [e for e in tev if e["kind"] == "resumed" and e["t"] > held["t"]]
    assert resumed["slices"] == [0, 2, 3] and resumed["program"] == "prepared", resumed


@pytest.mark.e2e
def test_the_same_notice_flushes_before_the_host_goes_when_no_slice_may_leave(tmp_path: Path) -> None:
    s, tev, journal, out = _demo(tmp_path, "--min-slices", "4")
    (f,) = s["faults"]
    assert f["flush_bytes"] > 0 and f["lost_steps"] == 0, f
    (held,) = [e for e in tev if e["kind"] == "held" and e["t"] >= f["time"]]
    assert held["flush"] and not held["flush_error"] and held["t"] < f["time"] + NOTICE_DEADLINE, (held, f["time"])
    hold = next(j for j in journal if any(a["type"] == "HoldTrainer" for a in j["actions"]) and j["time"] >= f["time"])
    assert "fewer than the minimum 4" in hold["reason"] and "with flush" in hold["reason"], hold["reason"]
    assert s["final_step"] == 60, out[-2000:]
