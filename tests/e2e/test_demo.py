"""The simulated multi-slice job end to end: real processes, real faults.

Each test runs ``elastic-sidecar demo`` (coordinator, worker sidecars,
stand-in Pathways workers, a JAX trainer with Orbax checkpoints) and checks
the summary it writes. A run takes 10-20 s on two cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e


def trainer_events(tmp_path: Path) -> list[dict[str, Any]]:
    """The events the demo's trainer wrote (one JSON object a line), in order."""
    return [json.loads(x) for x in (tmp_path / "job" / "trainer-events.jsonl").read_text().splitlines()]


def run_demo(tmp_path: Path, *args: str, timeout: float = 240) -> tuple[int, dict[str, Any], str]:
    summary = tmp_path / "summary.json"
    cmd = [
        sys.executable,
        "-m",
        "agent",
        "demo",
        "--workdir",
        str(tmp_path / "job"),
        "--summary-json",
        str(summary),
        "--replacement-delay",
        "2",
        "--timeout",
        "30",
        "--run-timeout",
        str(timeout - 30),
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    data = json.loads(summary.read_text()) if summary.exists() else {}
    return proc.returncode, data, out


def only_fault(s: dict[str, Any]) -> dict[str, Any]:
    assert len(s["faults"]) == 1, s["faults"]
    return s["faults"][0]


def test_kill_continues_on_survivors_then_grows_back(tmp_path: Path) -> None:
    plot = tmp_path / "run.png"
    rc, s, out = run_demo(
        tmp_path, "--steps", "120", "--min-slices", "2", "--fault", "kill:1.0@30", "--plot", str(plot)
    )
    assert rc == 0, out
    assert s["final_step"] == 120
    f = only_fault(s)
    assert f["slices_before"] == 4 and f["slices_after"] == 3, f
    assert f["restored_from"] == "memory"
    assert f["lost_steps"] is not None and f["lost_steps"] <= 1, f
    assert f["detection_seconds"] is not None and f["detection_seconds"] < 0.5, f
    # Grew back onto the replacement slice, with nothing lost.
    assert s["slices_timeline"][-1]["slices"] == [0, 1, 2, 3], s["slices_timeline"]
    assert s["slices_timeline"][-1]["restored_from"] == "memory"
    assert s["exit_codes"] == {"trainer": 0, "coordinator": 0}
    assert "Faults" in out and "kill:1.0" in out
    # Its recovery and its grow back, phase by phase (simjob/phases.py), and where each restore read from.
    phases = f["phases"]
    for name in (
        "detect",
        "hold",
        "wait",
        "rebuild",
        "restore",
        "first_step",
        "degraded",
        "grow_hold",
        "grow_wait",
        "grow_rebuild",
        "grow_restore",
        "grow_first_step",
        "total",
    ):
        assert isinstance(phases[name], int | float) and phases[name] >= 0, (name, phases)
    assert f["phase_restores"]["recovery"]["source"] == "live" and f["phase_restores"]["recovery"]["bytes"] > 0, f
    assert f["phase_restores"]["grow"] is not None, f
    assert s["startup_seconds"] > 0 and 0 < s["training_goodput"] <= 1, s
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # An unannounced loss compiles the smaller mesh's step on the resume; the grow keeps the full mesh's
    # program from the start, so it compiles nothing.
    programs = [(e["slices"], e["program"]) for e in trainer_events(tmp_path) if e["kind"] == "resumed"]
    assert programs[:3] == [([0, 1, 2, 3], "compiled"), ([0, 2, 3], "compiled"), ([0, 1, 2, 3], "kept")], programs


def test_min_slices_all_holds_until_replacement_with_no_lost_steps(tmp_path: Path) -> None:
    rc, s, out = run_demo(tmp_path, "--steps", "100", "--min-slices", "-1", "--fault", "kill:1.0@30")
    assert rc == 0, out
    f = only_fault(s)
    assert f["lost_steps"] == 0, f
    assert f["slices_after"] == 4, f
    # It held (no progress) until the stand-in provisioner brought slice 1 back.
    assert f["hold_seconds"] is not None and f["hold_seconds"] >= 1.5, f
    assert s["final_step"] == 100
    # The hold flushed: the step it held at is committed.
    ckpts = sorted(int(p.name) for p in (tmp_path / "job" / "checkpoints").iterdir() if p.name.isdigit())
    assert f["step_at_fault"] in ckpts or f["step_at_fault"] + 1 in ckpts, (f, ckpts)


def test_hung_host_is_detected_and_dropped(tmp_path: Path) -> None:
    rc, s, out = run_demo(tmp_path, "--steps", "120", "--min-slices", "2", "--fault", "hang:2.0@30")
    assert rc == 0, out
    f = only_fault(s)
    assert f["detection_seconds"] is not None and f["detection_seconds"] < 2.0, f
    assert f["lost_steps"] is not None and f["lost_steps"] <= 1, f
    assert s["final_step"] == 120
    assert any(2 not in t["slices"] for t in s["slices_timeline"]), s["slices_timeline"]


def test_timeout_with_too_few_slices_aborts_42_and_keeps_checkpoint(tmp_path: Path) -> None:
    rc, s, out = run_demo(
        tmp_path,
        "--steps",
        "100",
        "--min-slices",
        "-1",
        "--no-replacement",
        "--fault",
        "kill:1.0@30",
        "--timeout",
        "3",
    )
    assert rc == 42, out
    assert s["exit_codes"] == {"trainer": 42, "coordinator": 42}, s
    import orbax.checkpoint as ocp

    mngr = ocp.CheckpointManager(tmp_path / "job" / "checkpoints")
    step = mngr.latest_step()
    assert step is not None and step >= 30, mngr.all_steps()
    restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    assert restored["state"]["params"]["w1"].shape == (64, 256)
    # The coordinator's state file: state.json in its --state-dir (the demo's work directory).
    state = json.loads((tmp_path / "job" / "state.json").read_text())
    assert state["phase"] == "failed" and state["trainer"]["committed_step"] == step


def test_retries_exhausted_aborts_42(tmp_path: Path) -> None:
    rc, s, out = run_demo(
        tmp_path,
        "--steps",
        "150",
        "--min-slices",
        "1",
        "--max-retries",
        "1",
        "--fault",
        "kill:1.0@20",
        "--fault",
        "kill:2.0@60",
    )
    # One recovery allowed: the first kill is recovered from, the second is terminal.
    assert rc == 42, out
    assert s["exit_codes"]["coordinator"] == 42
    assert "elastic_max_retries=1" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--fault", "explode:1.0@3"], "explode"),
        (["--fault", "kill:9.0@3"], "slice 9"),
        (["--fault", "kill:1.0@500", "--steps", "100"], "step 500"),
        (["--min-slices", "7"], "7"),
        (["--slices", "0"], "'0'"),
    ],
)
def test_bad_demo_options_name_the_value(tmp_path: Path, args: list[str], needle: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agent", "demo", "--workdir", str(tmp_path / "job"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr, proc.stderr


# The Pub/Sub notice under --runslow: tests/e2e/test_demo_drain_from_memory.py's first run is that same run and
# asserts all of this but the timing.
@pytest.mark.parametrize(
    ("kind", "source"), [pytest.param("notice", "pubsub", marks=pytest.mark.slow), ("metadata", "metadata")]
)
def test_announced_disruption_is_drained_before_the_host_dies(tmp_path: Path, kind: str, source: str) -> None:
    """A maintenance notice (Pub/Sub log entry, or the host's metadata server) drains its slice with 0 lost steps."""
    rc, s, out = run_demo(
        tmp_path, "--steps", "120", "--min-slices", "2", "--fault", f"{kind}:1.0@30", "--notice-deadline", "4"
    )
    assert rc == 0, out
    f = only_fault(s)
    assert f["detection_source"] == f"NodeNotice({source})", f
    assert f["lost_steps"] == 0 and not f["interrupted_step"], f
    assert f["slices_after"] == 3 and f["restored_from"] == "memory", f
    # Drained (hold and resume done) well before the host died at its deadline.
    assert f["detection_seconds"] is not None and f["hold_seconds"] is not None
    assert f["detection_seconds"] + f["hold_seconds"] < 4.0, f
    print(f"{kind}: notice-to-hold {f['detection_seconds']:.3f} s, hold {f['hold_seconds']:.3f} s")
    journal = [json.loads(x) for x in (tmp_path / "job" / "journal.jsonl").read_text().splitlines()]
    lost = [j for j in journal if j["trigger"] == "WorkerLost" and j["event_detail"]["slice"] == 1]
    assert lost and not any(a["type"] == "HoldTrainer" for a in lost[0]["actions"]), "the death itself needed no hold"


def test_a_donated_state_resumes_from_an_older_snapshot_newer_than_the_last_checkpoint(tmp_path: Path) -> None:
    """With a snapshot every 8 steps the failed step's own state has none: the restore ladder takes the
    newest snapshot (at least as new as the newest committed checkpoint, none yet at step 30 with a
    period of 50) instead of starting over, and computes only the steps since it again.

    A hung host fails the step in flight (its slice takes no part in the collective), so the state
    donated into it is gone (a kill is often held at a step boundary first, with the state intact)."""
    rc, s, out = run_demo(
        tmp_path,
        "--steps",
        "80",
        "--min-slices",
        "2",
        "--fault",
        "hang:2.0@30",
        "--trainer-arg=--donate",
        "--trainer-arg=--snapshot-every=8",
    )
    assert rc == 0, out
    f = only_fault(s)
    assert f["restored_from"] == "memory", f
    assert f["lost_steps"] is not None and 0 < f["lost_steps"] <= 8, f
    events = trainer_events(tmp_path)
    assert any(e["kind"] == "step_failed" for e in events), "the hang must fail a step"
    resumed = [e for e in events if e["kind"] == "resumed" and e["restored_from"] == "memory"]
    assert resumed and resumed[0]["from_step"] % 8 == 0 and resumed[0]["from_step"] >= 24, resumed
    assert s["final_step"] == 80


def test_auto_stops_snapshots_that_would_need_the_checkpoint_period_and_frees_their_buffers(tmp_path: Path) -> None:
    """A state whose copy costs most of a step (512 MiB against a 50 ms step here) asks ``auto`` for an
    interval past the checkpoint period: after the probe round the trainer hands no more snapshots to the
    Snapshotter and, once a checkpoint at least as new as the last one commits, frees their memory."""
    rc, s, out = run_demo(
        tmp_path,
        "--steps",
        "120",
        "--checkpoint-period",
        "20",
        "--no-faults",
        "--trainer-arg=--donate",
        "--trainer-arg=--snapshot-every=auto",
        "--trainer-arg=--ballast-mib=128",
    )
    assert rc == 0, out
    assert s["final_step"] == 120
    events = trainer_events(tmp_path)
    chosen = [e for e in events if e["kind"] == "snapshot_every"]
    assert chosen and chosen[-1]["every"] == 0 and chosen[-1]["off"] and chosen[-1]["ceiling"] == 20, chosen
    off_at = chosen[-1]["t"]
    copies = [e for e in events if e["kind"] == "step" and e["snapshot"]]
    assert len(copies) >= 3, "at least the probe round's three"
    assert all(e["t"] <= off_at for e in copies), "no snapshot after auto turned them off"
    freed = [e for e in events if e["kind"] == "snapshot_buffers_freed"]
    assert len(freed) == 1 and freed[0]["t"] > off_at, freed


def test_a_rebuild_after_auto_stopped_snapshots_keeps_no_snapshot_buffers(tmp_path: Path) -> None:
    """After ``auto`` turned snapshots off, a slice lost before any checkpoint committed (so the buffers
    were not freed yet) rebuilds without keeping them: nothing would write into them again, and holding
    a copy of the state per slice through a checkpoint restore made that restore several times slower
    here (2.9-3.0 s against 0.6-0.8 s for 1 GiB)."""
    rc, s, out = run_demo(
        tmp_path,
        "--steps",
        "70",
        "--checkpoint-period",
        "50",
        "--min-slices",
        "2",
        "--fault",
        "kill:1.0@45",
        "--trainer-arg=--donate",
        "--trainer-arg=--snapshot-every=auto",
        "--trainer-arg=--ballast-mib=128",
        # A short step, so that a copy of the 512 MiB costs about a step (both are memory-bound): auto asks
        # for an interval near 70, past the period, and turns off after its probe round (about step 39).
        "--trainer-arg=--step-seconds=0.01",
    )
    assert rc == 0, out
    assert s["final_step"] == 70
    events = trainer_events(tmp_path)
    off = [e for e in events if e["kind"] == "snapshot_every" and e["off"]]
    failed = [e for e in events if e["kind"] == "step_failed"]
    assert off and failed and off[0]["t"] < failed[0]["t"], "auto was off before the slice was lost"
    assert not [e for e in events if e["kind"] == "snapshot_buffers_freed" and e["t"] < failed[0]["t"]]
    rebuilt = [e for e in events if e["kind"] == "resumed" and e["t"] > failed[0]["t"]]
    assert rebuilt and all(e["snapshot_buffers_bytes"] == 0 for e in rebuilt), rebuilt


@pytest.mark.parametrize("fault", ["kill:1.0@30", "hang:2.0@30"])
def test_donated_state_loses_at_most_the_step_in_flight(tmp_path: Path, fault: str) -> None:
    """With --donate (as MaxText) the failed step consumed the state: the per-slice snapshot taken before it stands in.

    Without the snapshot the trainer found no state left and restored its last checkpoint (none
    yet at step 30 with a period of 50: 30 steps lost).
    """
    rc, s, out = run_demo(tmp_path, "--steps", "80", "--min-slices", "2", "--fault", fault, "--trainer-arg=--donate")
    assert rc == 0, out
    f = only_fault(s)
    assert f["restored_from"] == "memory", f
    assert f["lost_steps"] is not None and f["lost_steps"] <= 1, f
    assert s["final_step"] == 80
